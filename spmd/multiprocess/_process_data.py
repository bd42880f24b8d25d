"""Global sharded tensors from each process's own rows: `make_global_tensor` and `make_global_batch`.

On a pod every host loads only its part of the batch. `make_global_tensor(local, mesh, spec)`
turns each process's ``local`` rows into one global tensor laid out as ``spec``, as JAX's
``jax.make_array_from_process_local_data`` does: no process ever holds the global batch. The
layout follows `spmd.multiprocess` (JAX's): along a dim split over several processes, each
process passes its part (its tiles in order); along any other dim, the whole dim.

On torch_xla (one process per host) the blocks go straight to this host's devices, each device
receiving only its block; on this machine, one process with 8 devices, ``local`` is the whole
batch. On the dtensor backend (one process per device) each rank's rows become its block of a
``DTensor``. `make_global_batch` does the same for a dict of tensors (a Hugging Face batch) with
a spec per key, with one exchange of shapes for the whole dict.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from mesh import DeviceCountError, Mesh, mesh_or_global
from mesh.checks import require_int
from spmd._backend import ShardingBackend, backend_for
from spmd._backend.agreement import agree, mesh_text, spec_text
from spmd.errors import LocalShapeMismatchError, MissingSpecError, SpmdTypeError
from spmd.multiprocess._process_layout import ProcessLayout
from spmd.sharding import NamedSharding, PartitionSpec, SpecEntry, hlo_sharding_for

__all__ = ["make_global_tensor", "make_global_batch", "process_rows"]

SpecLike = PartitionSpec | Sequence[SpecEntry]


def _as_tensor(local: object, what: str) -> torch.Tensor:
    if isinstance(local, np.ndarray):
        try:
            return torch.from_numpy(local)
        except TypeError:  # object, string or unsigned dtypes torch has no tensor of
            raise SpmdTypeError(
                f"{what}: a numpy array of dtype {local.dtype} has no torch dtype; give numbers (e.g. "
                "array.astype(np.float32) or np.int64)."
            ) from None
    if not isinstance(local, torch.Tensor):
        raise SpmdTypeError(
            f"{what}: the local data must be a torch.Tensor or numpy array, got {type(local).__name__}."
        )
    if local.device.type == "xla":
        raise SpmdTypeError(
            f"{what}: the local data of shape {tuple(local.shape)} is already on the XLA device; pass this process's "
            "rows as a host (CPU) tensor, as a data loader gives them, and they go to the devices sharded."
        )
    return local.detach()


def _backend_and_mesh(mesh: Mesh | None, what: str) -> tuple[ShardingBackend, Mesh]:
    backend = backend_for(None)
    mesh = mesh_or_global(mesh, what)
    try:
        mesh.check_device_count(backend.device_count(), backend.more_devices)
    except DeviceCountError as e:
        raise DeviceCountError(f"{what}: {e}") from None
    return backend, mesh


def _layout(backend: ShardingBackend, mesh: Mesh, spec: SpecLike, local: torch.Tensor, what: str) -> ProcessLayout:
    spec = PartitionSpec.from_value(spec)
    hlo = hlo_sharding_for(mesh, spec, local.dim())
    where = f"{what}(local shape {tuple(local.shape)}, spec {spec!r}, {mesh.describe()})"
    return ProcessLayout(hlo, local.dim(), backend.device_processes(), backend.process_index(), where)


SAME_DATA = (
    "Every rank passes its own rows of one global tensor: the same mesh, spec, dtype and row count on each "
    "(one rank runs a stale config, or its loader is at another position or on a last short batch?)."
)


def _agree(
    backend: ShardingBackend,
    what: str,
    mesh: Mesh | None,
    specs: Mapping[str, SpecLike] | SpecLike,
    tensors: Mapping[str, torch.Tensor] | None,
    more: Mapping[str, object],
    refused: Exception | None = None,
) -> None:
    """Every process makes the same global tensors (one small collective, which also checks the
    shapes): keys, local shapes and dtypes, spec, mesh, and ``more`` (a loader's position).

    ``refused``: this rank's arguments failed a local check (``tensors`` is then ``None``); it
    still takes part, so that a rank refusing alone does not leave the others waiting in the
    exchange until the process group's timeout (a raw gloo error), and they all fail together.

    Raises:
        LocalShapeMismatchError: only the local shapes differ.
        RankDisagreementError: anything else differs (one rank refused its arguments); the
            message names it and the ranks.
    """
    if tensors is None:
        unread = "(not read: this rank's arguments were refused)"
        shapes = dtypes = unread
        keys: dict[str, str] = {"keys": unread}
    else:
        label = (lambda k: "") if list(tensors) == [""] else (lambda k: f"{k}: ")
        keys = {} if list(tensors) == [""] else {"keys": str(sorted(tensors))}
        shapes = ", ".join(f"{label(k)}{tuple(t.shape)}" for k, t in tensors.items())
        dtypes = ", ".join(f"{label(k)}{str(t.dtype).removeprefix('torch.')}" for k, t in tensors.items())
    fields = {
        "arguments": "accepted" if refused is None else f"refused ({refused})",
        **keys,
        "mesh": mesh_text(mesh),
        "spec": _specs_text(specs),
        "local shape": shapes,
        "dtype": dtypes,
        **{k: str(v) for k, v in more.items()},
    }
    agree(backend, what, fields, SAME_DATA, {"local shape": LocalShapeMismatchError})


def _whole(value: object, name: str, what: str) -> int:
    return require_int(value, name, SpmdTypeError, minimum=0, allowed=f"a whole number >= 0 ({what})")


def _global_shape(given: object, what: str) -> tuple[int, ...]:
    """``global_shape`` as whole numbers (``int(2.5)`` would have read 2 silently)."""
    if isinstance(given, (str, bytes)) or not isinstance(given, (Sequence, np.ndarray)):
        raise SpmdTypeError(f"{what}'s global_shape is a sequence of dim sizes, e.g. (64, 128), got {given!r:.60}.")
    return tuple(_whole(n, f"{what}'s global_shape entry", "a dim size") for n in given)


def _check_flag(check: object, what: str) -> None:
    """``check`` as documented: a bool; ``False`` no longer skips the ranks' exchange.

    A per-call switch that skips a collective cannot be agreed on: one rank passing ``False``
    leaves the others in an exchange that meets its next, different collective, and gloo aborts
    every process (SIGABRT). So every process always agrees, and ``False`` says so once.
    """
    if not isinstance(check, bool):  # a string such as 'no' is truthy: it would read as True
        raise SpmdTypeError(f"{what}'s check takes True or False, got {check!r:.60}.")
    if not check:
        warnings.warn(
            f"{what}(check=False) no longer skips the ranks' agreement check: one rank skipping its collective would "
            "abort the others. It costs one small collective per call; leave check out.",
            FutureWarning,
            stacklevel=4,
        )


def _shape_text(shape: object) -> str:
    try:
        return repr(tuple(int(n) for n in shape))  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # refused by the layout's own check, once the ranks agree on it
        return repr(shape)


def _specs_text(specs: Mapping[str, SpecLike] | SpecLike) -> str:
    if isinstance(specs, Mapping):
        return "{" + ", ".join(f"{k!r}: {spec_text(v)}" for k, v in sorted(specs.items(), key=str)) + "}"
    return spec_text(specs)


def make_global_tensor(
    local: torch.Tensor | np.ndarray,
    mesh: Mesh | None,
    spec: SpecLike,
    *,
    global_shape: Sequence[int] | None = None,
    check: bool = True,
) -> torch.Tensor:
    """One global tensor laid out as ``spec`` from each process's ``local`` rows.

    Every process calls it with its own rows (JAX's ``make_array_from_process_local_data``).
    Along a dim that ``spec`` splits over several processes, ``local`` holds this process's
    part (the blocks of its devices, in order: `process_rows` says which global rows); along
    any other dim, the whole dim. With one process (torch_xla here), ``local`` is the whole
    tensor.

    Args:
        local: this process's rows, on the host.
        mesh: the mesh; ``None`` uses the global mesh.
        spec: how the global tensor is laid out.
        global_shape: the global shape; inferred when ``None`` (each split dim the processes'
            parts together).
        check: kept for old scripts; the processes always check that they passed the same
            mesh, spec, dtype and shapes (one small collective; with one process, nothing).
            ``False`` warns and checks anyway: a process that skipped the collective would leave
            the others waiting in it for a collective it never makes (gloo aborts them).

    Returns:
        The global tensor: on torch_xla an XLA tensor with the sharding (each device got only
        its block); on the dtensor backend a ``DTensor`` whose local tensor is this rank's block.

    Raises:
        LocalShapeMismatchError: the processes passed different shapes.
        RankDisagreementError: the processes passed another mesh, spec, dtype or global shape.
        IndivisibleBatchError: a split dim does not divide evenly over its devices.
        ProcessDataError: ``global_shape`` does not fit, or the processes' devices do not hold
            equal parts of a split dim.
        ShardingError: the spec does not fit the mesh or the tensor.
    """
    return global_tensor(local, mesh, spec, global_shape, check, {})


def global_tensor(
    local: torch.Tensor | np.ndarray,
    mesh: Mesh | None,
    spec: SpecLike,
    global_shape: Sequence[int] | None,
    check: bool,
    more: Mapping[str, object],
) -> torch.Tensor:
    """`make_global_tensor`, the ranks also agreeing on ``more`` (a loader's seed and position)
    in the same exchange."""
    what = "make_global_tensor"
    shape = {} if global_shape is None else {"global shape": _shape_text(global_shape)}
    try:
        tensor = _as_tensor(local, what)
        _check_flag(check, what)
    except SpmdTypeError as refused:  # in the exchange first: the other ranks must not wait for this one
        _agree(backend_for(None), what, mesh, spec, None, {**shape, **more}, refused)
        raise
    # First, on the arguments as given: every later check then fails alike on every rank.
    _agree(backend_for(None), what, mesh, spec, {"": tensor}, {**shape, **more})
    backend, mesh = _backend_and_mesh(mesh, f"{what}(local shape {tuple(tensor.shape)}, spec {spec!r})")
    return _make(backend, mesh, spec, tensor, global_shape, what)


def _make(
    backend: ShardingBackend, mesh: Mesh, spec: SpecLike, local: torch.Tensor, given: Sequence[int] | None, what: str
) -> torch.Tensor:
    layout = _layout(backend, mesh, spec, local, what)
    shape = layout.global_shape(tuple(local.shape), None if given is None else _global_shape(given, what))
    blocks = {d: local[slices] for d, (slices, _) in layout.blocks(shape, tuple(local.shape)).items()}
    spec = PartitionSpec.from_value(spec)
    hlo = hlo_sharding_for(mesh, spec, local.dim(), shape)
    return backend.from_local_blocks(blocks, NamedSharding(mesh, spec), hlo, shape)


def _batch_tensors(batch: object, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(batch, Mapping):
        raise SpmdTypeError(f"{what}: batch must be a dict of tensors (str -> tensor), got {type(batch).__name__}.")
    odd = [k for k in batch if not isinstance(k, str)]
    if odd:  # the ranks' exchange and the messages sort the keys: mixed types cannot be
        raise SpmdTypeError(
            f"{what}: batch keys must be strings (names of the batch's fields), got {odd[0]!r:.60} "
            f"({type(odd[0]).__name__}); name the fields, e.g. {{'input_ids': tensor}}."
        )
    return {k: _as_tensor(v, f"{what}: key {k!r}") for k, v in batch.items()}


def make_global_batch(
    batch: Mapping[str, torch.Tensor | np.ndarray],
    mesh: Mesh | None,
    specs: Mapping[str, SpecLike] | SpecLike,
    *,
    check: bool = True,
) -> dict[str, torch.Tensor]:
    """`make_global_tensor` for each value of a dict batch (a Hugging Face batch), with a spec
    per key (``specs`` a dict) or one spec for all; keys of ``specs`` absent from the batch are
    ignored (an eval batch without labels). One exchange of shapes checks the whole dict.

    Raises:
        MissingSpecError: a key of the batch has no spec; the message lists the keys that do.
        LocalShapeMismatchError: the processes passed different shapes.
        RankDisagreementError: the processes passed other keys, mesh, specs or dtypes.
        SpmdTypeError: ``batch`` is not a dict of tensors.
    """
    return global_batch(batch, mesh, specs, check, {})


def global_batch(
    batch: Mapping[str, torch.Tensor | np.ndarray],
    mesh: Mesh | None,
    specs: Mapping[str, SpecLike] | SpecLike,
    check: bool,
    more: Mapping[str, object],
) -> dict[str, torch.Tensor]:
    """`make_global_batch`, the ranks also agreeing on ``more`` in the same exchange."""
    what = "make_global_batch"
    try:
        tensors = _batch_tensors(batch, what)
        _check_flag(check, what)
    except SpmdTypeError as refused:  # in the exchange first: the other ranks must not wait for this one
        _agree(backend_for(None), what, mesh, specs, None, more, refused)
        raise
    _agree(backend_for(None), what, mesh, specs, tensors, more)  # first: ranks with other keys fail together
    per_key = isinstance(specs, Mapping)
    if per_key:
        missing = sorted(k for k in batch if k not in specs)
        if missing:
            raise MissingSpecError(
                f"{what}: the batch's keys {missing} have no spec; specs are given for {sorted(specs)}. Add a spec for "
                f"each key (e.g. {{{missing[0]!r}: P('data')}}), or pass one spec for all keys."
            )
    shapes = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in tensors.items())
    backend, mesh = _backend_and_mesh(mesh, f"{what}({{{shapes}}})")
    return {
        k: _make(backend, mesh, specs[k] if per_key else specs, v, None, f"{what}: key {k!r}")
        for k, v in tensors.items()
    }


def process_rows(mesh: Mesh | None, spec: SpecLike, global_size: int, dim: int = 0) -> list[int]:
    """The global indices along ``dim`` (the batch, by default) that this process feeds, in
    the order `make_global_tensor` expects them: what a per-process data loader loads.

    Raises:
        IndivisibleBatchError: ``global_size`` does not split evenly over the devices of ``dim``.
        SpmdTypeError: ``global_size`` or ``dim`` is not a whole number >= 0 (a negative ``dim``
            cannot be counted from the end here: the tensor's rank is not known).
    """
    global_size = _whole(global_size, "process_rows' global_size", "the rows of the global batch, e.g. 64")
    dim = _whole(dim, "process_rows' dim", "a dim counted from 0 (the tensor's rank is not known here, so not -1)")
    backend, mesh = _backend_and_mesh(mesh, f"process_rows(spec {spec!r}, {global_size} rows)")
    spec = PartitionSpec.from_value(spec)
    entries = list(spec) + [None] * (dim + 1 - len(spec))
    one_dim = PartitionSpec(*[entries[d] if d == dim else None for d in range(dim + 1)])
    hlo = hlo_sharding_for(mesh, one_dim, dim + 1)
    where = f"process_rows(spec {spec!r}, {global_size} rows along dim {dim}, {mesh.describe()})"
    layout = ProcessLayout(hlo, dim + 1, backend.device_processes(), backend.process_index(), where)
    return layout.rows(dim, global_size)
