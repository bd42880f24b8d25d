"""torch_xla's helpers around `XLAShardedTensor`: wrap a tensor (recording a mesh shape and spec),
wrap it only if the runtime holds a sharding for it, and unwrap it."""

from __future__ import annotations

from typing import Any

import torch

from spmd._backend.torch_xla_backend import runtime, shardings
from spmd._backend.torch_xla_backend.sharded_tensor import XLAShardedTensor
from spmd.errors import SpmdTypeError

__all__ = ["wrap_if_sharded", "wrap_as_sharded_tensor", "unwrap_sharded_tensor"]


def wrap_if_sharded(x: Any) -> Any:
    """``x`` as an `XLAShardedTensor` if it is an XLA tensor with a sharding, else ``x`` itself."""
    if isinstance(x, torch.Tensor) and not isinstance(x, XLAShardedTensor) and runtime.is_xla_tensor(x):
        if shardings.sharding_type(x) is not None:
            return XLAShardedTensor._view(x, None)
    return x


def wrap_as_sharded_tensor(t: torch.Tensor, mesh_shape: Any = None, partition_spec: Any = None) -> XLAShardedTensor:
    """``t`` as an `XLAShardedTensor` that records ``mesh_shape`` and ``partition_spec`` (torch_xla's
    helper). On an `XLAShardedTensor` it records the ones given in place and forgets its cached
    `_spec`, as torch_xla's does; nothing is laid out (`mark_sharding` does that).

    Raises:
        SpmdTypeError: ``t`` is not a tensor.
        MeshTypeError, MeshError, PartitionSpecTypeError: what it would record is not a mesh shape
            or a spec.
    """
    if not isinstance(t, torch.Tensor):
        raise SpmdTypeError(f"wrap_as_sharded_tensor expects a torch.Tensor, got {type(t).__name__}.")
    if not isinstance(t, XLAShardedTensor):
        if mesh_shape is None and partition_spec is None:
            return XLAShardedTensor._view(t, None)
        return XLAShardedTensor(t, mesh_shape, partition_spec)
    if mesh_shape is not None or partition_spec is not None:
        t._record(mesh_shape, partition_spec)
    return t


def unwrap_sharded_tensor(t: torch.Tensor) -> torch.Tensor:
    """The marked tensor behind an `XLAShardedTensor`, or ``t`` itself."""
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t
