"""The dtensor backend's process operations of `ShardingBackend`: one process per device.

Device id = rank, so process ``r`` holds device ``r`` alone and feeds one block of each global
tensor (`DTensorBackend.from_local_blocks` makes it this rank's local tensor).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["process_index", "process_count", "device_processes", "all_process_values", "from_local_block"]


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


def all_process_values(values: tuple[int, ...], *, same_length: bool = False) -> list[tuple[int, ...]]:
    """Every rank's ``values``, in rank order (a collective). ``same_length``: one all_gather
    of an int64 tensor (every rank passes as many values); else pickled objects, of any length
    (two collectives: the sizes, then the bytes)."""
    if not same_length:
        out: list[Any] = [None] * process_count()
        _dist().all_gather_object(out, tuple(int(v) for v in values))
        return [tuple(v) for v in out]
    dist = _dist()
    mine = torch.tensor(values, dtype=torch.int64, device=_collective_device())
    every = [torch.empty_like(mine) for _ in range(process_count())]
    dist.all_gather(every, mine)
    return [tuple(int(v) for v in t.tolist()) for t in every]


def _collective_device() -> torch.device:
    """Where a small tensor for a collective of the default group lives: the host with gloo
    (also when it is one of several backends, ``cpu:gloo,cuda:nccl``), else this process's
    accelerator (NCCL and TorchTPU's backend take only device tensors), or the host where there
    is none (a CUDA build of torch on a host with no GPU names CUDA unless asked to check)."""
    if "gloo" in str(_dist().get_backend()):
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


def from_local_block(
    blocks: dict[int, torch.Tensor], device_mesh: Any, placements: tuple[Any, ...], global_shape: tuple[int, ...]
) -> torch.Tensor:
    """A DTensor of ``global_shape`` on ``device_mesh`` with ``placements`` whose local tensor
    is this rank's only block, moved to the mesh's device."""
    from torch.distributed.tensor import DTensor

    (block,) = blocks.values()
    kind = device_mesh.device_type
    device = torch.device("cpu") if kind == "cpu" else torch.device(kind, torch.accelerator.current_device_index())
    stride = torch.empty(global_shape, device="meta").stride()
    local = block.to(device).contiguous()
    return DTensor.from_local(
        local, device_mesh, placements, run_check=False, shape=torch.Size(global_shape), stride=stride
    )
