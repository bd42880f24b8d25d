"""`ShardingSpec`: a (mesh, spec) for torch_xla's data loaders, which shard each batch on transfer.

``MpDeviceLoader(loader, device, input_sharding=ShardingSpec(mesh, ('data', None)))`` and
``xm.send_cpu_data_to_device(..., input_sharding=...)`` send each host tensor straight to the
devices as its shards (no replicated copy first). This is torch_xla's ``xs.ShardingSpec``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mesh import Mesh, MeshTypeError
from spmd._backend import backend
from spmd.named_sharding import hlo_sharding_for
from spmd.partition_spec import PartitionSpec

__all__ = ["ShardingSpec"]


@dataclass(frozen=True)
class ShardingSpec:
    """How a data loader lays out each batch tensor on the devices.

    Args:
        mesh: the mesh.
        partition_spec: one entry per dim of the tensors it applies to; tensors of another
            rank are sent replicated (torch_xla's rule, so labels of rank 1 and inputs of
            rank 2 can share one loader).
        minibatch: each host loads only its part of the global batch (multi-host input
            pipelines); dim 0 of a host's tensor is then its slice of the global batch.

    Example:
        >>> import numpy as np
        >>> spec = ShardingSpec(Mesh(np.arange(8), (8,), ("data",)), ("data", None))
        >>> spec.can_apply(torch.zeros(16, 4)), spec.can_apply(torch.zeros(16))
        (True, False)
    """

    mesh: Mesh
    partition_spec: PartitionSpec
    minibatch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.mesh, Mesh):
            raise MeshTypeError(f"ShardingSpec needs a mesh.Mesh, got {type(self.mesh).__name__}.")
        spec = PartitionSpec.from_value(self.partition_spec)
        hlo_sharding_for(self.mesh, spec, len(spec))  # a spec that cannot fit this mesh fails here, not per batch
        object.__setattr__(self, "partition_spec", spec)

    def can_apply(self, t: torch.Tensor) -> bool:
        """Whether ``t`` has exactly one dim per spec entry."""
        return len(t.shape) == len(self.partition_spec)

    def xla_spec(self, t: torch.Tensor) -> Any:
        """torch_xla's ``XlaShardingSpec`` for ``t``, or ``None`` when the spec does not apply."""
        if not self.can_apply(t):
            return None
        hlo = hlo_sharding_for(self.mesh, self.partition_spec, t.dim())
        return backend.xla_sharding_spec(t, hlo, self.minibatch)

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        """Shard XLA tensor ``t`` in place (`mark_sharding`) and return it."""
        from spmd.mark_sharding import mark_sharding

        return mark_sharding(t, self.mesh, self.partition_spec)
