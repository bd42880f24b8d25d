"""What differs between the torch releases we run on, public for ``fsdp_xla``: the torch_xla
lane's torch 2.9 and the current lane's 2.11 to 2.15 answered by feature detection or by
release (`is_shard`, `redistribute`, `flatten_device_mesh`, ...), and the private torch symbols
the product imports (`PRIVATE_SYMBOLS`: ``tree_flatten``, ``FakeTensor``,
``resolve_process_group``, ...), each named once and loaded on first use.

A private torch symbol here is as stable as torch keeps it, which is not at all: import it from
here so that when a torch release moves it, one table changes (tests/test_private_upstream.py
names the symbol). The implementation lives in ``spmd._util.torch_compat`` (private).
"""

from typing import Any

from spmd._util import torch_compat as _home
from spmd._util.torch_compat import PRIVATE_SYMBOLS as PRIVATE_SYMBOLS
from spmd._util.torch_compat import TORCH_VERSION as TORCH_VERSION
from spmd._util.torch_compat import clear_dtensor_sharding_caches as clear_dtensor_sharding_caches
from spmd._util.torch_compat import cpu_flash_attention as cpu_flash_attention
from spmd._util.torch_compat import device_mesh_from_ids as device_mesh_from_ids
from spmd._util.torch_compat import device_module_registration as device_module_registration
from spmd._util.torch_compat import flatten_device_mesh as flatten_device_mesh
from spmd._util.torch_compat import flight_record as flight_record
from spmd._util.torch_compat import group_ranks as group_ranks
from spmd._util.torch_compat import group_sequence_numbers as group_sequence_numbers
from spmd._util.torch_compat import group_timeout as group_timeout
from spmd._util.torch_compat import is_shard as is_shard
from spmd._util.torch_compat import is_strided_shard as is_strided_shard
from spmd._util.torch_compat import ordered_groups_supported as ordered_groups_supported
from spmd._util.torch_compat import redistribute as redistribute
from spmd._util.torch_compat import replicate_shard_mesh as replicate_shard_mesh
from spmd._util.torch_compat import set_group_timeout as set_group_timeout
from spmd._util.torch_compat import splits_empty_blocks as splits_empty_blocks
from spmd._util.torch_compat import strided_shard as strided_shard
from spmd._util.torch_compat import tpu_optimization_barrier as tpu_optimization_barrier

__all__ = list(_home.__all__)


def __getattr__(name: str) -> Any:
    """A private torch symbol of `PRIVATE_SYMBOLS`, loaded on first use."""
    return getattr(_home, name)
