"""torch_xla's ``torch_xla.distributed.spmd.xla_sharded_tensor`` names, from `spmd.sharded_tensor`.

``from torch_xla.distributed.spmd.xla_sharded_tensor import XLAShardedTensor`` becomes
``from spmd.xla_sharded_tensor import XLAShardedTensor``.
"""

from __future__ import annotations

from spmd.sharded_tensor import XLAShard, XLAShardedTensor

__all__ = ["XLAShard", "XLAShardedTensor"]
