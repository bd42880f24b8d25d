"""`ShardedTensor`: what `mark_sharding` returns, a view of a sharded lazy tensor and its shards."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spmd._backend import backend
from spmd.hlo_sharding import HloSharding, ShardBounds
from spmd.named_sharding import NamedSharding

__all__ = ["Shard", "ShardedTensor", "XLAShardedTensor"]


@dataclass(frozen=True)
class Shard:
    """One device's block of a sharded tensor, copied to the host.

    Attributes:
        device: the device id.
        index: slices of the global tensor this block covers (padding excluded).
        data: the block's values (padding excluded).
        padded_shape: the block's shape on the device, including XLA's padding.
        replica_id: which copy this is among devices that hold the same block.
    """

    device: int
    index: tuple[slice, ...]
    data: torch.Tensor
    padded_shape: tuple[int, ...]
    replica_id: int


class ShardedTensor:
    """A view of a lazy XLA tensor that carries a sharding.

    It does not copy or wrap the data: ``.global_tensor`` is the very tensor passed to
    `mark_sharding`, which keeps its sharding and stays usable in the model.

    Attributes:
        global_tensor: the sharded tensor itself (named as in torch_xla's XLAShardedTensor).
        sharding: the `NamedSharding` (mesh and spec) it was marked with.
    """

    __slots__ = ("global_tensor", "sharding")

    def __init__(self, tensor: torch.Tensor, sharding: NamedSharding) -> None:
        self.global_tensor = tensor
        self.sharding = sharding

    @property
    def tensor(self) -> torch.Tensor:
        """The sharded tensor (same object as ``global_tensor``)."""
        return self.global_tensor

    @property
    def global_shape(self) -> tuple[int, ...]:
        """The logical (unsharded) shape."""
        return tuple(self.global_tensor.shape)

    @property
    def hlo_sharding(self) -> HloSharding:
        """The XLA sharding."""
        return self.sharding.hlo_sharding(self.global_tensor.dim(), self.global_shape)

    @property
    def sharding_spec(self) -> str:
        """The HLO sharding text, as torch_xla's ``XLAShardedTensor.sharding_spec``."""
        return str(self.hlo_sharding)

    @property
    def shard_bounds(self) -> list[ShardBounds]:
        """Which block each device holds, with padding; computed, no device access."""
        return self.sharding.shard_bounds(self.global_shape)

    @property
    def padding(self) -> tuple[int, ...]:
        """The most padding any device's block has along each dim (zeros when even)."""
        bounds = self.shard_bounds
        return tuple(max(b.padding[d] for b in bounds) for d in range(len(self.global_shape)))

    @property
    def local_shards(self) -> list[Shard]:
        """Each addressable device's block, copied to the host, in device order.

        Runs the pending computation of this tensor if it has not run yet.
        """
        backend.sync_tensors([self.global_tensor])
        bounds = {b.device: b for b in self.shard_bounds}
        out = []
        for device, padded in backend.local_shards(self.global_tensor):
            b = bounds[device]
            data = padded[tuple(slice(0, n) for n in b.shape)]
            out.append(Shard(device, b.index, data, b.padded_shape, b.replica_id))
        return out

    def __repr__(self) -> str:
        return (
            f"ShardedTensor(shape={self.global_shape}, dtype={self.global_tensor.dtype}, "
            f"{self.sharding!r}, hlo={self.hlo_sharding})"
        )


XLAShardedTensor = ShardedTensor
"""torch_xla's name, so ``isinstance(x, XLAShardedTensor)`` in old scripts keeps working."""
