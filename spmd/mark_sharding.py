"""`mark_sharding` and its relatives: attach a (mesh, spec) sharding to lazy XLA tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mesh import DeviceCountError, Mesh, mesh_or_global
from spmd._backend import ShardingBackend, backend_for, torch_xla_backend
from spmd._backend.agreement import agree_on_sharding
from spmd._backend.torch_xla_backend.gradients import MarkShardingFunction
from spmd._util.torch_compat import tree_flatten, tree_unflatten
from spmd.errors import (
    PartitionSpecTypeError,
    ShardingError,
    SpmdTypeError,
)
from spmd.sharded_tensor import XLAShardedTensor
from spmd.sharding import (
    HloSharding,
    NamedSharding,
    PartitionSpec,
    SpecEntry,
    hlo_sharding_for,
    is_placements,
    spec_from_placements,
)

__all__ = [
    "mark_sharding",
    "resolve_sharding",
    "annotate_custom_sharding",
    "with_sharding_constraint",
    "mark_sharding_with_gradients",
    "MarkShardingFunction",
    "clear_sharding",
    "get_sharding",
    "shard_as",
]

SpecLike = PartitionSpec | Sequence[SpecEntry]


def _unwrap(t: object) -> torch.Tensor:
    if isinstance(t, XLAShardedTensor):
        return t.global_tensor
    if not isinstance(t, torch.Tensor):
        raise SpmdTypeError(
            f"Expected a torch.Tensor (or an XLAShardedTensor), got {type(t).__name__}; pass the tensor itself "
            "(torch.as_tensor(x) for a list or numpy array)."
        )
    return t


def resolve_sharding(
    t: torch.Tensor,
    mesh: Mesh | None,
    spec: SpecLike,
    what: str,
    backend: ShardingBackend | None = None,
    *,
    check_tensor: bool = True,
) -> tuple[NamedSharding, HloSharding]:
    """Check ``(mesh, spec)`` against ``t`` (pure checks first) and against the backend's devices.

    ``mesh`` may be a `Mesh`, torch_xla's mesh or a ``DeviceMesh`` (``None``: the global mesh);
    ``spec`` a `PartitionSpec`, a tuple, or DTensor placements (one per mesh axis). With
    ``check_tensor=False`` the backend need not accept ``t`` as it is (it will be moved).
    """
    backend = backend or backend_for(t)
    spec, mesh = _spec_and_mesh(t, mesh, spec, what)
    hlo = hlo_sharding_for(mesh, spec, t.dim(), tuple(t.shape))  # spec errors first: pure checks
    context = f"{what}(tensor of shape {tuple(t.shape)}, spec {spec!r}, {mesh.describe()})"
    if check_tensor and not backend.accepts(t):
        raise backend.refusal(t, context)
    available = backend.device_count()
    try:
        mesh.check_device_count(available, backend.more_devices)
    except DeviceCountError as e:
        raise DeviceCountError(f"{context}: {e}") from None
    return NamedSharding(mesh, spec), hlo


def _spec_and_mesh(t: torch.Tensor, mesh: object, spec: object, what: str) -> tuple[PartitionSpec, Mesh]:
    if _looks_like_a_spec(mesh) and _looks_like_a_mesh(spec):
        raise SpmdTypeError(
            f"{what}(tensor of shape {tuple(t.shape)}, {mesh!r:.80}, {type(spec).__name__}): the mesh and the spec "
            f"are swapped; the order is {what}(t, mesh, partition_spec)."
        )
    if is_placements(spec):  # DTensor's vocabulary: one placement per mesh axis
        mesh = mesh_or_global(mesh, f"{what}(tensor of shape {tuple(t.shape)}, placements {list(spec)})")
        return spec_from_placements(spec, mesh, t.dim()), mesh
    try:
        spec = PartitionSpec.from_value(spec)
    except (ShardingError, PartitionSpecTypeError) as e:  # say which call, tensor and mesh
        where = mesh.describe() if isinstance(mesh, Mesh) else "the global mesh"
        raise type(e)(f"{what}(tensor of shape {tuple(t.shape)}, over {where}): {e}") from None
    return spec, mesh_or_global(mesh, f"{what}(tensor of shape {tuple(t.shape)}, spec {spec!r})")


def _looks_like_a_spec(value: object) -> bool:
    return isinstance(value, (PartitionSpec, tuple, list)) or is_placements(value)


def _looks_like_a_mesh(value: object) -> bool:
    return isinstance(value, Mesh) or hasattr(value, "mesh_shape") or hasattr(value, "mesh_dim_names")


def mark_sharding(
    t: torch.Tensor,
    mesh: Mesh | None,
    partition_spec: SpecLike,
    *,
    replace: bool = False,
) -> XLAShardedTensor:
    """Shard ``t`` over ``mesh`` as ``partition_spec`` says, and return it as a sharded tensor.

    On device data (inputs, parameters) the data is laid out sharded, in place. On a traced
    intermediate it becomes a sharding constraint inside the graph (see
    `with_sharding_constraint`). Turns on SPMD mode if it is off.

    Args:
        t: a tensor on an XLA device (parameters included).
        mesh: the mesh (ours, torch_xla's, or a ``DeviceMesh``); ``None`` uses the global mesh.
        partition_spec: a `PartitionSpec` or a torch_xla-style tuple; it may be shorter than
            ``t.dim()`` (trailing dims replicated). Or DTensor's placements, one per mesh axis
            (``[Shard(0), Replicate()]``; `spmd.sharding`).
        replace: if ``t`` already has a different non-replicated sharding, replace it instead
            of raising. A replicated ``t`` (explicitly, or as every step's output is) is
            resharded without it, as torch_xla does.

    Returns:
        The tensor to keep. On torch_xla: ``t`` as an `XLAShardedTensor`, a ``torch.Tensor``
        view of the same data (use it in the model, add to it, ``.cpu()`` it; gradients flow to
        ``t``) with ``sharding``, ``shard_bounds``, ``local_shards`` and torch_xla's attributes;
        ``t`` itself is sharded too, so the return value may be ignored there. On the dtensor
        backend (see `spmd.use_backend`): a ``DTensor``, and ``t`` is unchanged.

    Raises:
        NoMeshError: ``mesh`` is ``None`` and no global mesh is set.
        NotAnXlaTensorError: ``t`` is not on an XLA device.
        ShardingError: the spec does not fit the mesh or the tensor (the message says which).
        DeviceCountError: the mesh does not use exactly the backend's devices.
        ShardingConflictError: ``t`` already has another non-replicated sharding and
            ``replace`` is False, or it is manually sharded.

    Example:
        >>> mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))   # doctest: +SKIP
        >>> x = mark_sharding(torch.randn(16, 32).to(torch_xla.device()), mesh, P("data"))  # doctest: +SKIP
        >>> (x @ w).sum().backward()                                # doctest: +SKIP
        >>> x.shard_bounds[0].shape                                 # doctest: +SKIP
        (4, 32)
    """
    if not isinstance(replace, bool):  # a truthy string such as 'no' would replace the sharding
        raise SpmdTypeError(f"mark_sharding's replace takes True or False, got {replace!r:.80}.")
    tensor = _unwrap(t)
    backend = backend_for(tensor)
    # Ranks agree first, on the arguments as given: then every later check fails alike on all.
    agree_on_sharding(backend, "mark_sharding", tensor, mesh, partition_spec, replace=replace)
    sharding, hlo = resolve_sharding(tensor, mesh, partition_spec, "mark_sharding", backend)
    return backend.shard(tensor, sharding, hlo, replace=replace)


def annotate_custom_sharding(t: torch.Tensor, mesh: Mesh | None, partition_spec: SpecLike) -> XLAShardedTensor:
    """Constrain ``t``'s traced value to ``partition_spec`` in place, without moving its data.

    torch_xla's ``annotate_custom_sharding``: unlike `mark_sharding`, device data keeps its
    layout (the graph reads it as it is and then reshards), and an existing sharding is no
    conflict. Returns ``t`` as an `XLAShardedTensor`.
    """
    tensor = _unwrap(t)
    sharding, hlo = resolve_sharding(tensor, mesh, partition_spec, "annotate_custom_sharding")
    torch_xla_backend.ensure_spmd()
    torch_xla_backend.attach_sharding_constraint(tensor, hlo, sharding.mesh.memo)
    return XLAShardedTensor._view(tensor, sharding)


def with_sharding_constraint(x: torch.Tensor, mesh: Mesh | None, partition_spec: SpecLike) -> torch.Tensor:
    """A copy of ``x`` that GSPMD must lay out as ``partition_spec`` at this point of the graph.

    Like ``jax.lax.with_sharding_constraint``: ``x`` is unchanged, the result carries the
    constraint; gradients flow through it unconstrained (see `mark_sharding_with_gradients`).
    """
    tensor = _unwrap(x)
    backend = backend_for(tensor)
    sharding, hlo = resolve_sharding(tensor, mesh, partition_spec, "with_sharding_constraint", backend)
    return backend.constrain(tensor, sharding, hlo)


def mark_sharding_with_gradients(x: torch.Tensor, mesh: Mesh | None, partition_spec: SpecLike) -> torch.Tensor:
    """`with_sharding_constraint` whose gradient carries the same constraint in backward.

    torch_xla's ``mark_sharding_with_gradients``; use it on activations whose backward
    GSPMD would otherwise lay out badly. ``x`` is unchanged (not sharded in place).
    """
    tensor = _unwrap(x)
    backend = backend_for(tensor)
    sharding, hlo = resolve_sharding(tensor, mesh, partition_spec, "mark_sharding_with_gradients", backend)
    return backend.constrain_with_gradient(tensor, sharding, hlo)


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Remove ``t``'s sharding annotation (in place) and return the tensor.

    On the dtensor backend a DTensor's layout is not an annotation, and the result is a new,
    replicated DTensor: keep the return value (``t = clear_sharding(t)``), as with `mark_sharding`.

    Raises:
        NotAnXlaTensorError: on the torch_xla backend, a tensor not on the XLA device.
    """
    tensor = _unwrap(t)
    return backend_for(tensor).clear(tensor)


def get_sharding(t: torch.Tensor) -> HloSharding | None:
    """The XLA sharding ``t`` carries now, or ``None`` if it has none."""
    tensor = _unwrap(t)
    return backend_for(tensor).sharding_of(tensor)


def shard_as(a: Any, b: Any) -> tuple[Any, Any]:
    """Give matching tensors of pytrees ``a`` and ``b`` one sharding, whichever GSPMD picks
    (XLA's ``ShardAlike``; torch_xla's ``shard_as``). Returns both trees; use either output.

    Raises:
        TypeError: the trees differ in structure, or a leaf is ``None`` in one tree only.
        ShardingError: two matching tensors differ in shape (XLA's ShardAlike pairs equal shapes).
        NotAnXlaTensorError: a tensor is not on the XLA device.
    """
    a_leaves, a_tree = tree_flatten(a)
    b_leaves, b_tree = tree_flatten(b)
    if a_tree != b_tree:
        raise SpmdTypeError(
            f"shard_as needs two pytrees of one structure, got {str(a_tree):.200} and {str(b_tree):.200}; pair the "
            "tensors alike in both (the same nesting of lists, tuples and dicts)."
        )
    out_a, out_b = [], []
    for i, (x, y) in enumerate(zip(a_leaves, b_leaves)):
        if x is None or y is None:
            if (x is None) != (y is None):
                raise SpmdTypeError(f"shard_as: leaf {i} is None in one tree only; put None in both or neither.")
        else:
            x, y = torch_xla_backend.shard_alike(*_shard_as_pair(i, _unwrap(x), _unwrap(y)))
        out_a.append(x)
        out_b.append(y)
    return tree_unflatten(out_a, a_tree), tree_unflatten(out_b, b_tree)


def _shard_as_pair(i: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Leaf ``i`` of both trees, checked: one shape, both on the XLA device."""
    context = f"shard_as(leaf {i}: tensors of shape {tuple(x.shape)} and {tuple(y.shape)})"
    if x.shape != y.shape:
        raise ShardingError(f"{context}: the two differ in shape; shard_as pairs tensors of one shape.")
    xla = torch_xla_backend.TorchXlaBackend()
    for t in (x, y):
        if not xla.accepts(t):
            raise xla.refusal(t, context)
    return x, y
