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

__all__ = ["is_dtensor", "distributed", "dtensor_index", "first_holders", "agree", "broadcast", "place_dtensor"]


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


def dtensor_index(t: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """The bounds of this rank's block of DTensor ``t``, from ``t``'s own DeviceMesh: under tensor
    parallelism FSDP2 keeps a parameter it does not split over ``tensor`` on a slice of the world
    (the FSDP axes at this rank's tensor coordinate), so the other slices hold the same blocks."""
    from spmd.backend import backend_for

    hlo = backend_for(t).sharding_of(t)
    (bounds,) = hlo.shard_bounds(tuple(t.shape), [_rank()])
    return tuple((s.start, s.stop) for s in bounds.index)


def first_holders(indices: dict[str, tuple[tuple[int, int], ...]]) -> set[str]:
    """The names of ``indices`` (this rank's block bounds, by tensor) whose block no lower rank
    holds: each distinct block is written once, by its lowest rank, whether its copies are on
    one DeviceMesh (a replicated placement) or on slices of the world (tensor parallelism).
    A collective: all ranks call it in the same order."""
    lower = agree(indices)[: _rank()]
    return {name for name, index in indices.items() if all(other.get(name) != index for other in lower)}


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

    from spmd.backend import backend_for

    hlo = backend_for(target).sharding_of(target)
    (bounds,) = hlo.shard_bounds(tuple(target.shape), [_rank()])
    local = full[bounds.index].to(target.dtype).contiguous()
    return DTensor.from_local(
        local, target.device_mesh, target.placements, run_check=False, shape=target.shape, stride=target.stride()
    )
