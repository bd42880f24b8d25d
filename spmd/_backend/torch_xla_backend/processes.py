"""torch_xla's process operations of `ShardingBackend`: one process per host, several devices each.

On a TPU pod every host runs one process holding its chips; on this machine one process holds
8 virtual CPU devices, so ``process_count() == 1`` and every device is process 0's. With several
processes, which process holds which device is learnt the way torch_xla learns its master's
address (``_spmd_find_master_ip``): each process puts its own index in the blocks of its devices
of a global ``(devices, k)`` tensor, and every process reads the whole tensor back.
"""

from __future__ import annotations

import numpy as np
import torch

from spmd._backend.torch_xla_backend import runtime as xla
from spmd._backend.torch_xla_backend.shardings import device_id, from_cpu_shards
from spmd.sharding import HloSharding

__all__ = ["process_index", "process_count", "device_processes", "all_process_values", "from_local_blocks"]


def process_index() -> int:
    """This process's index (``xr.process_index()``)."""
    return int(xla._xlac()._xla_get_process_index())


def process_count() -> int:
    """The number of processes (``xr.process_count()``)."""
    return int(xla._xlac()._xla_get_num_processes())


def _local_devices() -> list[int]:
    """This process's device ids, in the order torch_xla lists its local devices (the order
    ``_global_tensor_from_cpu_shards`` takes shards in)."""
    return [device_id(d) for d in xla._xlac()._xla_get_runtime_devices()]


def _per_device(values: list[int]) -> np.ndarray:
    """A ``(devices, len(values))`` array whose row ``d`` is the ``values`` of the process
    holding device ``d`` (a collective over all processes)."""
    xla.ensure_spmd()
    n = xla.device_count()
    rows = torch.tensor([values], dtype=torch.int64)
    column = HloSharding.tiled(np.arange(n).reshape(n, 1))
    whole = from_cpu_shards([rows] * len(_local_devices()), column, (n, len(values)))
    return whole.cpu().numpy()


def device_processes() -> tuple[int, ...]:
    """The process holding each device id."""
    if process_count() == 1:
        return (0,) * xla.device_count()
    return tuple(int(p) for p in _per_device([process_index()])[:, 0])


def all_process_values(values: tuple[int, ...], *, same_length: bool = False) -> list[tuple[int, ...]]:
    """Every process's ``values``, in process order (a collective). ``same_length``: every
    process passes as many values (one exchange, not two)."""
    if process_count() == 1:
        return [tuple(values)]
    lengths = np.full(xla.device_count(), len(values)) if same_length else _per_device([len(values)])[:, 0]
    padded = list(values) + [0] * (int(lengths.max()) - len(values))
    table = _per_device([process_index(), *padded])
    first_row = {int(row[0]): i for i, row in reversed(list(enumerate(table)))}
    return [tuple(int(v) for v in table[i, 1 : 1 + int(lengths[i])]) for _, i in sorted(first_row.items())]


def from_local_blocks(blocks: dict[int, torch.Tensor], hlo: HloSharding, global_shape: tuple[int, ...]) -> torch.Tensor:
    """A global XLA tensor laid out as ``hlo`` from this process's device blocks (host tensors,
    unpadded: each is padded here to the block shape the devices hold)."""
    xla.ensure_spmd()
    shards = []
    for device in _local_devices():
        (bounds,) = hlo.shard_bounds(global_shape, [device])
        block = blocks[device]
        if tuple(block.shape) != bounds.padded_shape:  # XLA holds the short last blocks padded
            padded = block.new_zeros(bounds.padded_shape)
            padded[tuple(slice(0, n) for n in block.shape)] = block
            block = padded
        shards.append(block.contiguous())
    return from_cpu_shards(shards, hlo, global_shape)
