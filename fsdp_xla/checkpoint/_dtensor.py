"""Sharded checkpoints of DTensor models (the dtensor backend), in the same format as GSPMD's.

One process per device: every rank writes the blocks it holds (one copy of each replicated
block) into ``device-<rank>.safetensors`` of the new version; rank 0 holds the directory's lock,
gathers the index entries, writes ``index.json`` and commits with the ``LATEST`` rename. Loading
reads the same format whichever backend wrote it, so a checkpoint saved by torch_xla on 8
devices loads into a DTensor model on 4 processes, and the reverse: each rank assembles a
tensor's blocks and keeps the block its DTensor holds.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["is_dtensor", "distributed", "dtensor_block", "agree", "broadcast", "place_dtensor"]


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a ``torch.distributed.tensor.DTensor``."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def distributed(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether a save of ``tensors`` is one of several processes' (any of them a DTensor)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and any(is_dtensor(t) for t in tensors.values())


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def dtensor_block(t: torch.Tensor) -> tuple[int, tuple[tuple[int, int], ...], torch.Tensor] | None:
    """(rank, block bounds, host data) of this rank's block of DTensor ``t``, or ``None`` when
    another rank writes the same block (a replica)."""
    import torch.distributed as dist

    from spmd._backend import backend_for

    rank = _rank()
    hlo = backend_for(t).sharding_of(t)
    # Every device asked, not this rank alone: a replicated sharding numbers the copies by their
    # place in the list asked for, so asked alone every rank was copy 0 and wrote the block
    # (an index of overlapping blocks, which the load refuses as damaged).
    bounds = hlo.shard_bounds(tuple(t.shape), list(range(dist.get_world_size())))[rank]
    if bounds.replica_id != 0:
        return None
    index = tuple((s.start, s.stop) for s in bounds.index)
    return rank, index, t.to_local().detach().cpu().contiguous()


def agree(value: Any) -> list[Any]:
    """Every rank's ``value`` (a collective: all ranks call it in the same order)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def place_dtensor(target: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """A DTensor laid out as ``target`` holding ``full`` (this rank keeps its own block)."""
    from torch.distributed.tensor import DTensor

    from spmd._backend import backend_for

    hlo = backend_for(target).sharding_of(target)
    (bounds,) = hlo.shard_bounds(tuple(target.shape), [_rank()])
    local = full[bounds.index].to(target.dtype).contiguous()
    return DTensor.from_local(
        local, target.device_mesh, target.placements, run_check=False, shape=target.shape, stride=target.stride()
    )
