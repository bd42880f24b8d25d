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
from spmd._backend import torch_xla_backend
from spmd.errors import ShardingError, SpmdTypeError
from spmd.sharding import PartitionSpec, hlo_sharding_for

__all__ = ["ShardingSpec"]


@dataclass(frozen=True)
class ShardingSpec:
    """How a data loader lays out each batch tensor on the devices.

    Args:
        mesh: the mesh.
        partition_spec: the spec of the batch's tensors, read as `mark_sharding` reads one: it
            may be shorter than a tensor's rank (the leading dims are split, the rest
            replicated), and its trailing ``None`` entries beyond a tensor's rank are dropped,
            so ``('data', None)`` splits 2-D inputs, 1-D labels and 4-D attention masks alike
            on their batch dim. A 0-d tensor is sent replicated (it has no dim to split). A
            spec that names a dim a tensor does not have raises `ShardingError` (torch_xla
            sends such a tensor replicated, silently).
        minibatch: each host loads only its part of the global batch (multi-host input
            pipelines); dim 0 of a host's tensor is then its slice of the global batch.

    Example:
        >>> import numpy as np
        >>> spec = ShardingSpec(Mesh(np.arange(8), (8,), ("data",)), ("data", None))
        >>> spec.can_apply(torch.zeros(16, 4)), spec.can_apply(torch.zeros(16)), spec.can_apply(torch.zeros(()))
        (True, True, False)
    """

    mesh: Mesh
    partition_spec: PartitionSpec
    minibatch: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.partition_spec, Mesh) and isinstance(self.mesh, (PartitionSpec, tuple, list)):
            raise MeshTypeError("ShardingSpec(spec, mesh): the two are swapped; the order is ShardingSpec(mesh, spec).")
        if not isinstance(self.mesh, Mesh):
            raise MeshTypeError(f"ShardingSpec needs a mesh.Mesh, got {type(self.mesh).__name__}.")
        spec = PartitionSpec.from_value(self.partition_spec)
        hlo_sharding_for(self.mesh, spec, len(spec))  # a spec that cannot fit this mesh fails here, not per batch
        object.__setattr__(self, "partition_spec", spec)
        if not isinstance(self.minibatch, bool):  # a truthy string such as 'no' would turn it on
            raise SpmdTypeError(f"ShardingSpec's minibatch takes True or False, got {self.minibatch!r:.80}.")

    def spec_for(self, t: torch.Tensor) -> PartitionSpec | None:
        """The spec ``t`` is sent with (trailing ``None`` entries beyond its rank dropped), or
        ``None`` for a 0-d tensor (sent replicated).

        Raises:
            ShardingError: the spec splits a dim ``t`` does not have.
            SpmdTypeError: ``t`` is not a tensor.
        """
        if not isinstance(t, torch.Tensor):
            raise SpmdTypeError(f"ShardingSpec lays out tensors, got {t!r:.80} ({type(t).__name__}).")
        if t.dim() == 0:
            return None
        entries = list(self.partition_spec)
        while len(entries) > t.dim() and entries[-1] is None:
            entries.pop()
        if len(entries) > t.dim():
            raise ShardingError(
                f"ShardingSpec {self.partition_spec!r} over {self.mesh.describe()} splits dim {len(entries) - 1}, but "
                f"a batch tensor has shape {tuple(t.shape)}: it would be sent replicated. Give that key a spec of its "
                "own (a dict of ShardingSpec per key), or a spec that fits every tensor of the batch."
            )
        return PartitionSpec(*entries)

    def can_apply(self, t: torch.Tensor) -> bool:
        """Whether the spec splits ``t`` (it has a dim, and every dim the spec splits)."""
        try:
            return self.spec_for(t) is not None
        except ShardingError:
            return False

    def xla_spec(self, t: torch.Tensor) -> Any:
        """torch_xla's ``XlaShardingSpec`` for ``t``, or ``None`` for a 0-d tensor (replicated).

        Raises:
            ShardingError: the spec splits a dim ``t`` does not have.
        """
        spec = self.spec_for(t)
        if spec is None:
            return None
        hlo = hlo_sharding_for(self.mesh, spec, t.dim(), tuple(t.shape))
        return torch_xla_backend.xla_sharding_spec(t, hlo, self.minibatch)

    def apply(self, t: torch.Tensor) -> torch.Tensor:
        """Shard XLA tensor ``t`` in place (`mark_sharding`) and return it."""
        from spmd.mark_sharding import mark_sharding

        spec = self.spec_for(t)
        return t if spec is None else mark_sharding(t, self.mesh, spec)
