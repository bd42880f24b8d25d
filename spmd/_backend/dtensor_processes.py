"""The dtensor backend's process operations of `ShardingBackend`: one process per device.

Device id = rank, so process ``r`` holds device ``r`` alone and feeds one block of each global
tensor; the block becomes this rank's local tensor of a ``DTensor.from_local`` with the
placements `placements_for` gives (GSPMD's blocks, which DTensor holds as they are).
"""

from __future__ import annotations

from typing import Any

import torch

from spmd._backend.dtensor_backend import device_mesh, placements_for, process_device_type
from spmd.named_sharding import NamedSharding

__all__ = ["process_index", "process_count", "device_processes", "all_process_values", "from_local_blocks"]


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def process_index() -> int:
    """This process's rank."""
    return int(_dist().get_rank())


def process_count() -> int:
    """The world size."""
    return int(_dist().get_world_size())


def device_processes() -> tuple[int, ...]:
    """Device ``r`` is rank ``r``'s."""
    return tuple(range(process_count()))


def all_process_values(values: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every rank's ``values``, in rank order (a collective)."""
    out: list[Any] = [None] * process_count()
    _dist().all_gather_object(out, tuple(int(v) for v in values))
    return [tuple(v) for v in out]


def _process_device() -> torch.device:
    kind = process_device_type()
    return torch.device("cpu") if kind == "cpu" else torch.device(kind, torch.accelerator.current_device_index())


def from_local_blocks(
    blocks: dict[int, torch.Tensor], sharding: NamedSharding, global_shape: tuple[int, ...]
) -> torch.Tensor:
    """A DTensor of ``global_shape`` laid out as ``sharding`` whose local tensor is this rank's
    block (moved to this process's device).

    Raises:
        ShardingError: a layout DTensor cannot hold (see `placements_for`).
    """
    from torch.distributed.tensor import DTensor

    (block,) = blocks.values()
    placements = placements_for(sharding.mesh, sharding.spec, global_shape)
    mesh = device_mesh(sharding.mesh, process_device_type())
    stride = torch.empty(global_shape, device="meta").stride()
    local = block.to(_process_device()).contiguous()
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(global_shape), stride=stride)
