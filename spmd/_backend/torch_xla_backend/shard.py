"""`Shard` (torch_xla's ``XLAShard``): one device's block of a sharded tensor, copied to the host."""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from spmd._backend.torch_xla_backend import shardings

__all__ = ["Shard"]


@dataclass
class Shard:
    """One device's block of a sharded tensor, copied to the host (torch_xla's ``XLAShard``).

    Mutable on purpose, as torch_xla's: edit ``data`` (or assign a new tensor) and pass the
    list to `XLAShardedTensor.load_local_shards_`.

    Attributes:
        data: the block as the device holds it, **including** XLA's padding of uneven dims
            (torch_xla's meaning); `unpadded_data` drops the padding.
        indices: slices of the global tensor this block covers (``slice(start, stop, 1)`` per
            dim, padding excluded), or ``Ellipsis`` when the tensor is replicated.
        shard_device: the torch_xla device string the block came from (``"xla:3"``...).
        replica_id: which copy this is among the devices holding the same block; for a
            replicated tensor, the device's ordinal.
    """

    data: torch.Tensor
    indices: types.EllipsisType | list[slice]
    shard_device: str
    replica_id: int

    @property
    def device(self) -> int:
        """The device id (the number in `shard_device`)."""
        return shardings.device_id(self.shard_device)

    @property
    def index(self) -> tuple[slice, ...]:
        """The block's slices of the global tensor, also for replicated data (whole dims)."""
        if self.indices is Ellipsis:
            return tuple(slice(0, n) for n in self.data.shape)
        return tuple(slice(s.start, s.stop) for s in self.indices)

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """The block's shape on the device, padding included."""
        return tuple(self.data.shape)

    @property
    def unpadded_data(self) -> torch.Tensor:
        """``data`` without XLA's padding (a view of it)."""
        return self.data[tuple(slice(0, s.stop - s.start) for s in self.index)]

    @unpadded_data.setter
    def unpadded_data(self, value: torch.Tensor) -> None:
        self.data[tuple(slice(0, s.stop - s.start) for s in self.index)] = value
