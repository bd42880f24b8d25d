"""`mark_sharding` and its relatives: attach a (mesh, spec) sharding to lazy XLA tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mesh import DeviceCountError, Mesh, get_global_mesh
from spmd._backend import backend
from spmd.errors import NotAnXlaTensorError, ShardingConflictError
from spmd.hlo_sharding import HloSharding
from spmd.named_sharding import NamedSharding, hlo_sharding_for
from spmd.partition_spec import PartitionSpec, SpecEntry
from spmd.sharded_tensor import ShardedTensor

__all__ = [
    "mark_sharding",
    "with_sharding_constraint",
    "mark_sharding_with_gradients",
    "clear_sharding",
    "get_sharding",
]

SpecLike = PartitionSpec | Sequence[SpecEntry]


def _unwrap(t: object) -> torch.Tensor:
    if isinstance(t, ShardedTensor):
        return t.global_tensor
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"Expected a torch.Tensor (or ShardedTensor), got {type(t).__name__}.")
    return t


def _resolve(t: torch.Tensor, mesh: Mesh | None, spec: SpecLike, what: str) -> tuple[NamedSharding, HloSharding]:
    spec = PartitionSpec.from_value(spec)
    if mesh is None:
        mesh = get_global_mesh()
        if mesh is None:
            raise ValueError(
                f"{what}(tensor of shape {tuple(t.shape)}, spec {spec!r}) got no mesh and no global "
                "mesh is set. Pass a mesh, or call mesh.set_global_mesh(...) / use `with use_mesh(...)`."
            )
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{what} expects a mesh.Mesh, got {type(mesh).__name__}.")
    hlo = hlo_sharding_for(mesh, spec, t.dim(), tuple(t.shape))  # spec errors first: pure checks
    if not backend.is_xla_tensor(t):
        raise NotAnXlaTensorError(
            f"{what}: the tensor of shape {tuple(t.shape)} is on device '{t.device}', not an XLA "
            f"device, so it cannot carry spec {spec!r} over {mesh.describe()}. Move it first: "
            "t = t.to(torch_xla.device()) (modules: model.to(torch_xla.device()))."
        )
    available = backend.device_count()
    mesh.check_device_count(available)
    if mesh.size() != available:
        raise DeviceCountError(
            f"{what}: {mesh.describe()} has {mesh.size()} devices but the runtime has {available}; "
            f"GSPMD partitions every program over all {available} devices, so a mesh must use each "
            f"of them once. Build it over range({available})."
        )
    return NamedSharding(mesh, spec), hlo


def mark_sharding(
    t: torch.Tensor | ShardedTensor,
    mesh: Mesh | None,
    partition_spec: SpecLike,
    *,
    replace: bool = False,
) -> ShardedTensor:
    """Shard ``t`` over ``mesh`` as ``partition_spec`` says.

    On device data (inputs, parameters) the data is laid out sharded, in place. On a traced
    intermediate it becomes a sharding constraint inside the graph (see
    `with_sharding_constraint`). Turns on SPMD mode if it is off.

    Args:
        t: a tensor on an XLA device (parameters included).
        mesh: the mesh; ``None`` uses the global mesh.
        partition_spec: a `PartitionSpec` or a torch_xla-style tuple; it may be shorter than
            ``t.dim()`` (trailing dims replicated).
        replace: if ``t`` already has a different sharding, replace it instead of raising.

    Returns:
        A `ShardedTensor` view (global shape, sharding, local shards). ``t`` itself is sharded.

    Raises:
        NotAnXlaTensorError: ``t`` is not on an XLA device.
        ShardingError: the spec does not fit the mesh or the tensor (the message says which).
        DeviceCountError: the mesh does not use exactly the runtime's devices.
        ShardingConflictError: ``t`` already has another sharding and ``replace`` is False.

    Example:
        >>> mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))   # doctest: +SKIP
        >>> w = torch.randn(16, 32).to(torch_xla.device())         # doctest: +SKIP
        >>> mark_sharding(w, mesh, P(None, "model")).shard_bounds[0].shape  # doctest: +SKIP
        (16, 16)
    """
    tensor = _unwrap(t)
    sharding, hlo = _resolve(tensor, mesh, partition_spec, "mark_sharding")
    backend.ensure_spmd()
    existing = backend.sharding_of(tensor)
    if existing is not None and existing != hlo:
        if not replace:
            raise ShardingConflictError(
                f"mark_sharding: the tensor of shape {tuple(tensor.shape)} is already sharded as "
                f"{existing}; spec {sharding.spec!r} over {sharding.mesh.describe()} asks for {hlo}. "
                "Call clear_sharding(t) first, or pass replace=True to reshard it."
            )
        backend.clear_sharding(tensor)
        existing = None
    if existing is None:
        backend.attach_sharding(tensor, hlo)
    return ShardedTensor(tensor, sharding)


def with_sharding_constraint(x: torch.Tensor, mesh: Mesh | None, partition_spec: SpecLike) -> torch.Tensor:
    """A copy of ``x`` that GSPMD must lay out as ``partition_spec`` at this point of the graph.

    Like ``jax.lax.with_sharding_constraint``: ``x`` is unchanged, the result carries the
    constraint; gradients flow through it unconstrained (see `mark_sharding_with_gradients`).
    """
    tensor = _unwrap(x)
    _, hlo = _resolve(tensor, mesh, partition_spec, "with_sharding_constraint")
    backend.ensure_spmd()
    out = tensor.clone()
    backend.attach_sharding_constraint(out, hlo)
    return out


class _ConstrainWithGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, hlo: HloSharding) -> torch.Tensor:  # type: ignore[override]
        ctx.hlo = hlo
        out = x.clone()
        backend.attach_sharding_constraint(out, hlo)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        g = grad.clone()
        backend.attach_sharding_constraint(g, ctx.hlo)
        return g, None


def mark_sharding_with_gradients(x: torch.Tensor, mesh: Mesh | None, partition_spec: SpecLike) -> torch.Tensor:
    """`with_sharding_constraint` whose gradient carries the same constraint in backward.

    torch_xla's ``mark_sharding_with_gradients``; use it on activations whose backward
    GSPMD would otherwise lay out badly.
    """
    tensor = _unwrap(x)
    _, hlo = _resolve(tensor, mesh, partition_spec, "mark_sharding_with_gradients")
    backend.ensure_spmd()
    return _ConstrainWithGradient.apply(tensor, hlo)


def clear_sharding(t: torch.Tensor | ShardedTensor) -> torch.Tensor:
    """Remove ``t``'s sharding annotation (in place) and return the tensor."""
    tensor = _unwrap(t)
    if not backend.is_xla_tensor(tensor):
        raise NotAnXlaTensorError(
            f"clear_sharding: the tensor of shape {tuple(tensor.shape)} is on '{tensor.device}'; "
            "only XLA tensors carry shardings."
        )
    backend.clear_sharding(tensor)
    return tensor


def get_sharding(t: torch.Tensor | ShardedTensor) -> HloSharding | None:
    """The XLA sharding ``t`` carries now, or ``None`` if it has none."""
    tensor = _unwrap(t)
    if not backend.is_xla_tensor(tensor):
        return None
    return backend.sharding_of(tensor)
