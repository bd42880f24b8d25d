"""Shardings on torch_xla tensors: our `HloSharding` to torch_xla's ``OpSharding`` and back,
attached to and read from lazy tensors, and each device's block (local shards, manual sharding,
global tensors from host shards)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from spmd._backend.torch_xla_backend.runtime import _xlac, torch_xla_module
from spmd.sharding import HloSharding, ShardingKind

# torch_xla's ShardingType enum values (they are OpSharding.Type's).
_REPLICATED, _MAXIMAL, _TILED, _MANUAL, _PARTIAL = 0, 1, 3, 4, 5

__all__ = [
    "attach_sharding",
    "attach_sharding_constraint",
    "clear_sharding",
    "reshard_in_graph",
    "device_id",
    "from_cpu_shards",
    "full_to_shard_shape",
    "load_local_shards",
    "local_shard_devices",
    "local_shards",
    "mark_manual_sharding",
    "op_sharding",
    "shard_to_full_shape",
    "sharding_args",
    "sharding_of",
    "sharding_text",
    "sharding_type",
    "to_device_sharded",
    "xla_sharding_spec",
    "MAX_TILED_RANK",
]

# torch_xla 2.9 reads a tile assignment from nested Python lists of at most 5 levels
# (xla_sharding_util.cpp); a deeper one only logs an error and fails later with an unrelated
# RuntimeError (found by the fuzz campaign), so it is refused first.
MAX_TILED_RANK = 5


def sharding_args(hlo: HloSharding) -> tuple[list, list, list, int]:
    """``(tile assignment, group assignment, replication groups, type)``: the arguments torch_xla's
    ``OpSharding`` and ``XlaShardingSpec`` both take after the tensor (and what its
    ``Mesh._get_op_sharding_args`` returns)."""
    if hlo.kind is ShardingKind.REPLICATED:
        return [], [], [], _REPLICATED
    if hlo.kind is ShardingKind.MAXIMAL:
        return [list(hlo.devices)], [], [], _MAXIMAL
    if hlo.kind is ShardingKind.MANUAL:
        return [], [], [], _MANUAL
    if len(hlo.tile_shape) > MAX_TILED_RANK:
        from spmd.errors import ShardingError

        raise ShardingError(
            f"torch_xla 2.9 can only split tensors of at most {MAX_TILED_RANK} dims, but {hlo} splits one of "
            f"{len(hlo.tile_shape)} dims. Reshape it to {MAX_TILED_RANK} dims or fewer (merge the dims that are "
            "not split) before sharding it, or replicate it with P()."
        )
    if hlo.replication == 1:
        return hlo.tile_assignment().reshape(hlo.tile_shape).tolist(), [], [], _TILED
    assignment = hlo.tile_assignment()
    groups = assignment.reshape(-1, hlo.replication).tolist()
    group_ids = np.arange(len(groups)).reshape(hlo.tile_shape).tolist()
    return assignment.tolist(), group_ids, groups, _PARTIAL


def op_sharding(hlo: HloSharding, cache: dict | None = None) -> Any:
    """torch_xla's ``OpSharding`` for ``hlo``.

    With ``cache`` (a mesh's `Mesh.memo`), each distinct sharding is built once per mesh, as
    torch_xla's ``Mesh.get_op_sharding`` caches it (each build counts in torch_xla's
    ``CreateOpSharding`` metric, and is costly on a large mesh).
    """
    if cache is None:
        return _xlac().OpSharding(*sharding_args(hlo))
    key = ("op_sharding", hlo)
    if key not in cache:
        cache[key] = _xlac().OpSharding(*sharding_args(hlo))
    return cache[key]


def xla_sharding_spec(t: torch.Tensor, hlo: HloSharding, minibatch: bool = False) -> Any:
    """torch_xla's ``XlaShardingSpec`` of ``hlo`` for ``t``: what its data loaders and
    ``send_cpu_data_to_device(input_sharding=...)`` take. With ``minibatch`` the batch dim of
    ``t`` is this host's part of the global batch."""
    return _xlac().XlaShardingSpec(t, *sharding_args(hlo), bool(minibatch))


def to_device_sharded(cpu_tensor: torch.Tensor, hlo: HloSharding) -> torch.Tensor:
    """Copy a host tensor to the XLA device laid out as ``hlo``: each device receives only its
    shard (no replicated copy is made first, unlike ``t.to(device)`` + ``mark_sharding``)."""
    torch_xla = torch_xla_module()

    device = str(torch_xla.device())
    return _xlac()._xla_tensors_from_aten([cpu_tensor], [device], [xla_sharding_spec(cpu_tensor, hlo)])[0]


def attach_sharding(t: torch.Tensor, hlo: HloSharding, cache: dict | None = None) -> None:
    """Attach ``hlo`` to ``t`` in place: device data is resharded; a traced value gets a
    sharding custom-call (a constraint). Raises torch_xla's RuntimeError if ``t`` already has
    an annotation; callers clear it first."""
    op = op_sharding(hlo, cache)
    try:
        _xlac()._xla_mark_sharding(t, op)
    except RuntimeError as e:
        # A step's output right after torch_xla.sync(): its device data is still being computed
        # (execution is asynchronous) and torch_xla refuses to reshard it. Wait, then reshard.
        if "Data does not present on any device" not in str(e):
            raise
        _xlac()._xla_wait_device_ops(devices=[])
        _xlac()._xla_mark_sharding(t, op)


def attach_sharding_constraint(t: torch.Tensor, hlo: HloSharding, cache: dict | None = None) -> None:
    """Put a sharding custom-call on ``t``'s traced value without touching its data."""
    _xlac()._xla_annotate_custom_sharding(t, op_sharding(hlo, cache))


def reshard_in_graph(t: torch.Tensor) -> None:
    """Make sharded device data ``t`` a traced value (``t *= 1``), so that a new sharding
    attached to it is laid out by the next graph instead of at once.

    Resharding device data at once is torch_xla's ``ReshardData``, which builds and compiles a
    new identity program on every call (no cache: pjrt_computation_client.cpp): alternating
    ``mark_sharding(w, ..., replace=True)`` between two specs measured 20 compiles in 20 steps,
    in plain torch_xla too. Traced, the reshard is part of the step's graph, which torch_xla
    caches by its input and output shardings: 2 variants, compiled once each. Left alone: an
    intermediate of an autograd graph (the in-place op would invalidate what backward saved).
    """
    if t.requires_grad and not t.is_leaf:
        return
    if "\nIR: None\n" not in str(_xlac()._get_xla_tensor_debug_info(t)):
        return  # already traced: the sharding goes on its IR as it is
    with torch.no_grad():
        t.mul_(True)  # ``True`` is 1 in t's dtype, bool included; XLA folds the multiply away


def clear_sharding(t: torch.Tensor) -> None:
    """Remove ``t``'s sharding annotation."""
    _xlac()._xla_clear_sharding(t)


def sharding_type(t: torch.Tensor) -> int | None:
    """torch_xla's ``ShardingType`` value of ``t``'s sharding, or ``None`` when it has none."""
    value = _xlac()._get_xla_sharding_type(t)
    return None if value is None else int(value)


def sharding_of(t: torch.Tensor) -> HloSharding | None:
    """The sharding torch_xla holds for ``t``, or ``None`` when it has none."""
    text = _xlac()._get_xla_sharding_spec(t)
    return HloSharding.parse(text) if text else None


def sharding_text(t: torch.Tensor) -> str:
    """torch_xla's own text for ``t``'s sharding ('' when it has none)."""
    return str(_xlac()._get_xla_sharding_spec(t))


def local_shards(t: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """``(device id, padded CPU copy of the shard)`` for each addressable device."""
    return [(device_id(dev), data) for data, dev in local_shard_devices(t)]


def device_id(name: str) -> int:
    """The device id in a torch_xla device string (``"CPU:3"``, ``"xla:3"`` -> 3)."""
    return int(name.rsplit(":", 1)[-1])


def local_shard_devices(t: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    """``(padded CPU copy of the shard, torch_xla device string)`` for each addressable device."""
    return [(data, str(dev)) for data, dev in _xlac()._get_local_shards([t])[0]]


def load_local_shards(t: torch.Tensor, shards: list[torch.Tensor], devices: list[str]) -> None:
    """Replace the device data of sharded ``t`` by ``shards`` (host tensors, padded as the
    devices hold them), one per entry of ``devices`` (torch_xla device strings)."""
    _xlac()._load_local_shards(t, shards, devices)


def mark_manual_sharding(t: torch.Tensor) -> None:
    """Mark traced ``t`` as manually sharded (``{manual}``): GSPMD leaves it alone."""
    _xlac()._mark_manual_sharding(t, op_sharding(HloSharding.manual()))


def full_to_shard_shape(t: torch.Tensor) -> torch.Tensor:
    """XLA's ``SPMDFullToShardShape`` of sharded ``t``: each device's block, manual from here."""
    return _xlac()._spmd_full_to_shard_shape(t)


def shard_to_full_shape(
    t: torch.Tensor, hlo: HloSharding, shape: tuple[int, ...], dtype: torch.dtype, cache: dict | None = None
) -> torch.Tensor:
    """XLA's ``SPMDShardToFullShape``: manual per-device blocks ``t`` back to a global tensor of
    ``shape`` laid out as ``hlo``."""
    return _xlac()._spmd_shard_to_full_shape(t, op_sharding(hlo, cache), torch.Size(shape), dtype)


def from_cpu_shards(shards: list[torch.Tensor], hlo: HloSharding, global_shape: tuple[int, ...] | None) -> torch.Tensor:
    """A global XLA tensor laid out as ``hlo`` whose device ``i`` holds ``shards[i]`` (host
    tensors, one per runtime device, padded blocks allowed; ``global_shape`` trims padding)."""
    size = None if global_shape is None else torch.Size(global_shape)
    return _xlac()._global_tensor_from_cpu_shards(shards, op_sharding(hlo), size)
