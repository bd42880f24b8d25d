"""Each device's block of a sharded tensor on the host (torch_xla's ``local_shards``), and the
way back (``load_local_shards_``), checked before anything is loaded."""

from __future__ import annotations

import torch

from spmd._backend.torch_xla_backend import runtime, shardings
from spmd._backend.torch_xla_backend.shard import Shard
from spmd.errors import ShardLoadError
from spmd.sharding import HloSharding, ShardingKind

__all__ = ["local_shards", "load_local_shards"]


def local_shards(tensor: torch.Tensor) -> list[Shard]:
    """Each addressable device's block of ``tensor``, copied to the host, in device order. Runs
    the pending computation of ``tensor`` first.

    Raises:
        ShardLoadError: the tensor is manually sharded.
    """
    runtime.sync_tensors([tensor])
    hlo = shardings.sharding_of(tensor) or HloSharding.replicated()  # computed now: it holds its layout
    if hlo.kind is ShardingKind.MANUAL:
        raise ShardLoadError(
            f"The tensor of shape {tuple(tensor.shape)} is manually sharded ({{manual}}); it has no global "
            "layout to cut into shards. Call disable_manual_sharding(...) first."
        )
    shards = shardings.local_shard_devices(tensor)
    replicated = hlo.kind is not ShardingKind.TILED
    bounds = {b.device: b for b in hlo.shard_bounds(tuple(tensor.shape), [shardings.device_id(d) for _, d in shards])}
    out = []
    for data, device in shards:
        b = bounds[shardings.device_id(device)]
        indices = Ellipsis if replicated else [slice(s.start, s.stop, 1) for s in b.index]
        out.append(Shard(data, indices, device, b.replica_id))
    return out


def load_local_shards(
    tensor: torch.Tensor, shards: list[Shard], hlo: HloSharding | None, *, also: torch.Tensor
) -> None:
    """Replace each device's block of ``tensor`` by ``shards[i].data`` (padded, as `local_shards`
    gives it); ``also``, a view of ``tensor``, gets the same blocks.

    Raises:
        ShardLoadError: the tensor is replicated, a device is missing or repeated, or a block has
            the wrong shape or dtype. It is also a ``RuntimeError``, as torch_xla raises.
    """
    hlo = hlo or HloSharding.replicated()
    where = f"load_local_shards_ (tensor of shape {tuple(tensor.shape)}, sharding {hlo})"
    if hlo.kind is not ShardingKind.TILED:
        raise ShardLoadError(
            f"{where}: a replicated tensor has no per-device blocks to load. Assign a new tensor, "
            "or mark it sharded first."
        )
    expected = {d: shape for d, shape in _padded_block_shapes(tensor, hlo)}
    given = [shardings.device_id(s.shard_device) for s in shards]
    if sorted(given) != sorted(expected):
        raise ShardLoadError(
            f"{where}: got blocks for devices {sorted(given)}, need exactly one for each of "
            f"{sorted(expected)}. Pass the whole list local_shards returned."
        )
    for s in shards:
        shape = tuple(s.data.shape)
        if s.data.dtype != tensor.dtype:  # the load would cast silently
            raise ShardLoadError(
                f"{where}: the block for {s.shard_device} is {s.data.dtype}, the tensor {tensor.dtype}. Convert "
                f"the blocks first (shard.data = shard.data.to({tensor.dtype}))."
            )
        if shape != expected[shardings.device_id(s.shard_device)]:
            raise ShardLoadError(
                f"{where}: the block for {s.shard_device} has shape {shape}; the device holds "
                f"{expected[shardings.device_id(s.shard_device)]} (padding included)."
            )
    datas, devices = [s.data for s in shards], [s.shard_device for s in shards]
    shardings.load_local_shards(tensor, datas, devices)
    if also is not tensor:
        # This view is a second tensor over the same data; the load swaps device data
        # under both, which functionalization cannot see, so each gets it.
        shardings.load_local_shards(also, datas, devices)


def _padded_block_shapes(tensor: torch.Tensor, hlo: HloSharding) -> list[tuple[int, tuple[int, ...]]]:
    devices = list(range(runtime.device_count()))
    return [(b.device, b.padded_shape) for b in hlo.shard_bounds(tuple(tensor.shape), devices)]
