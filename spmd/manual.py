"""Manual sharding regions: per-device blocks that GSPMD leaves alone, between two boundaries.

``enable_manual_sharding(t, spec)`` shards ``t`` as ``spec`` and hands back each device's
block (XLA's ``SPMDFullToShardShape``); code in between sees block-shaped tensors and may call
collectives itself, like ``jax.shard_map``'s body. ``disable_manual_sharding(t, spec,
full_shape)`` turns the blocks back into one global tensor (``SPMDShardToFullShape``). These are
torch_xla's functions of the same names.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mesh import Mesh, mesh_or_global
from mesh.checks import is_int
from spmd._backend import torch_xla_backend
from spmd.errors import NotAnXlaTensorError, ShardingConflictError, ShardingError, SpmdTypeError
from spmd.mark_sharding import SpecLike, _unwrap, mark_sharding
from spmd.sharded_tensor import XLAShardedTensor
from spmd.sharding import NamedSharding, PartitionSpec, ShardingKind

__all__ = ["enable_manual_sharding", "disable_manual_sharding", "mark_manual_sharding"]


def enable_manual_sharding(t: torch.Tensor, partition_spec: SpecLike, *, mesh: Mesh | None = None) -> XLAShardedTensor:
    """Shard ``t`` as ``partition_spec`` and return this device's block of it, manually sharded.

    The result has the block shape (``(8, 8)`` split 8 ways on dim 1 is ``(8, 1)``). Every value
    computed from it is manual too, until `disable_manual_sharding`.

    Raises:
        NoMeshError: no ``mesh`` and no global mesh.
        ShardingError: the spec does not fit (see `mark_sharding`).
    """
    tensor = _unwrap(t)
    mesh = mesh_or_global(mesh, f"enable_manual_sharding(tensor of shape {tuple(tensor.shape)})")
    sharded = mark_sharding(tensor, mesh, partition_spec)
    block = torch_xla_backend.full_to_shard_shape(sharded.global_tensor)
    return XLAShardedTensor._view(block, sharded.sharding)


def disable_manual_sharding(
    t: torch.Tensor, partition_spec: SpecLike, full_shape: Sequence[int], *, mesh: Mesh | None = None
) -> XLAShardedTensor:
    """Join per-device blocks ``t`` into one global tensor of ``full_shape`` sharded as ``partition_spec``.

    Raises:
        NoMeshError: no ``mesh`` and no global mesh.
        ShardingError: ``full_shape`` and ``partition_spec`` do not fit ``t``'s block shape.
        SpmdTypeError: ``full_shape`` is not a tuple of sizes.
    """
    tensor = _unwrap(t)
    if (
        isinstance(full_shape, (str, bytes))
        or not isinstance(full_shape, Sequence)
        or not all(is_int(n) and n >= 0 for n in full_shape)
    ):
        raise SpmdTypeError(
            f"disable_manual_sharding's full_shape is the global shape, a tuple of sizes >= 0 such as (8, 4); got "
            f"{full_shape!r:.80} ({type(full_shape).__name__})."
        )
    shape = tuple(int(n) for n in full_shape)
    mesh = mesh_or_global(mesh, f"disable_manual_sharding(tensor of shape {tuple(tensor.shape)})")
    if not torch_xla_backend.is_xla_tensor(tensor):
        raise NotAnXlaTensorError(
            f"disable_manual_sharding: the block of shape {tuple(tensor.shape)} is on '{tensor.device}', not an "
            "XLA device."
        )
    sharding = NamedSharding(mesh, PartitionSpec.from_value(partition_spec))
    hlo = sharding.hlo_sharding(len(shape), shape)
    expected = sharding.shard_shape(shape)
    if tuple(tensor.shape) != expected:
        raise ShardingError(
            f"disable_manual_sharding: a block of shape {tuple(tensor.shape)} does not come from full_shape "
            f"{shape} split as {sharding.spec!r} over {mesh.describe()}, whose blocks are {expected}. "
            "Pass the full_shape and spec given to enable_manual_sharding."
        )
    mark_manual_sharding(tensor)
    full = torch_xla_backend.shard_to_full_shape(tensor, hlo, shape, tensor.dtype, mesh.memo)
    return XLAShardedTensor._view(full, sharding)


def mark_manual_sharding(t: torch.Tensor) -> XLAShardedTensor:
    """Mark traced ``t`` as ``{manual}`` (torch_xla's ``_mark_manual_sharding``); a low-level
    step of `disable_manual_sharding`.

    Raises:
        ShardingConflictError: ``t`` is device data (not computed in this graph) or already
            has a non-manual sharding; also a ``RuntimeError``, as torch_xla raises.
    """
    tensor = _unwrap(t)
    if not torch_xla_backend.is_xla_tensor(tensor):
        raise NotAnXlaTensorError(f"mark_manual_sharding: the tensor is on '{tensor.device}', not an XLA device.")
    existing = torch_xla_backend.sharding_of(tensor)
    if existing is not None and existing.kind is not ShardingKind.MANUAL:
        raise ShardingConflictError(
            f"mark_manual_sharding: the tensor of shape {tuple(tensor.shape)} is sharded as {existing}; only a "
            "value computed inside a manual region (from enable_manual_sharding's result) can be marked manual. "
            "Call clear_sharding(t) first if you mean to."
        )
    try:
        torch_xla_backend.mark_manual_sharding(tensor)
    except RuntimeError as e:  # torch_xla refuses device data
        raise ShardingConflictError(
            f"mark_manual_sharding: the tensor of shape {tuple(tensor.shape)} is device data, not a value computed "
            f"in this graph, so it cannot be marked manual ({str(e).splitlines()[0]}). Compute it from the "
            "block enable_manual_sharding returned."
        ) from None
    return XLAShardedTensor._view(tensor, None)
