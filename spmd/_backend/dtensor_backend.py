"""The DTensor backend: `ShardingBackend` on ``torch.distributed``'s DTensor, one process per device.

A `Mesh` becomes a ``DeviceMesh`` over the same ranks, in the same order and with the same axis
names (its device ids are ranks, increasing along every axis: DTensor hands out an axis's blocks
in rank order whatever the mesh says); a `PartitionSpec` becomes placements: a dim sharded by one
mesh axis is ``Shard(dim)`` on that axis, by several axes in mesh order ``Shard(dim)`` on each
(the first is the major one, as in GSPMD), by two axes against mesh order ``_StridedShard`` on
the first; mesh axes the spec does not name are ``Replicate()``. `shard` distributes a plain
tensor (every rank holds the same global value, rank 0's is sent) or redistributes a DTensor,
and returns the DTensor; that is the value to keep. This runs on TorchTPU (``tpu`` device),
GPUs, and CPU processes with the gloo backend.

Where DTensor's layout differs from GSPMD's, or DTensor cannot make it, this raises a
`ShardingError` instead of laying data out differently: a dim split over several mesh axes must
divide evenly (DTensor splits it axis by axis, each time rounding up; GSPMD once over all of
them), no device's block may be empty (torch 2.9's ``distribute_tensor`` fails on some), and at
most two axes may be given against mesh order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from spmd.errors import ShardingConflictError, ShardingError
from spmd.hlo_sharding import HloSharding, ShardingKind
from spmd.named_sharding import NamedSharding, hlo_sharding_for, resolve_spec
from spmd.partition_spec import PartitionSpec

__all__ = ["DTensorBackend", "device_mesh", "placements_for", "spec_of"]


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def device_type_of(t: torch.Tensor) -> str:
    """The DeviceMesh device type for tensors like ``t`` (``cpu`` with gloo, ``cuda``, ``tpu``)."""
    return t.device.type


def device_mesh(mesh: Any, device_type: str) -> Any:
    """The ``DeviceMesh`` of ``mesh`` (built once per mesh and device type: building one makes
    a process group per axis, collectively, so every rank must ask in the same order)."""
    from torch.distributed.device_mesh import DeviceMesh

    key = ("device_mesh", device_type)
    if key not in mesh.memo:
        logical = mesh.get_logical_mesh()
        if any((np.diff(logical, axis=k) <= 0).any() for k in range(mesh.ndim)):
            from mesh import MeshError

            raise MeshError(
                f"{mesh.describe()} with device ids {logical.tolist()} cannot be a DeviceMesh as it is: DTensor "
                "hands out each axis's blocks in rank order, so along every mesh axis the ids must increase "
                "(measured with torch 2.9). Transpose the mesh instead of reversing it, e.g. "
                "np.arange(n).reshape(b, a).T for a (a, b) mesh whose first axis is the inner one."
            )
        names = mesh.axis_names or tuple(f"axis{i}" for i in range(mesh.ndim))
        mesh.memo[key] = DeviceMesh(device_type, torch.as_tensor(mesh.get_logical_mesh()), mesh_dim_names=names)
    return mesh.memo[key]


def placements_for(mesh: Any, spec: PartitionSpec, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """DTensor placements (one per mesh axis) that lay a tensor of ``shape`` out as ``spec``.

    Raises:
        ShardingError: the layout differs from GSPMD's on DTensor (see the module docstring).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    dims = resolve_spec(mesh, spec, len(shape), shape)
    placements: list[Any] = [Replicate() for _ in range(mesh.ndim)]
    for dim, axes in enumerate(dims):
        if not axes:
            continue
        where = f"tensor of shape {tuple(shape)}, spec {spec!r}, {mesh.describe()}"
        ways = math.prod(mesh.mesh_shape[a] for a in axes)
        if ways > 1 and -(-shape[dim] // ways) * (ways - 1) >= shape[dim]:
            raise ShardingError(
                f"{where}: dim {dim} ({shape[dim]}) split {ways} ways leaves some devices an empty block, which "
                "DTensor (torch 2.9) fails to lay out (a padding error inside distribute_tensor). Split it fewer "
                "ways, or pad the dim."
            )
        if len(axes) > 1:
            ways = math.prod(mesh.mesh_shape[a] for a in axes)
            if shape[dim] % ways:
                raise ShardingError(
                    f"{where}: dim {dim} ({shape[dim]}) is split over {len(axes)} mesh axes ({ways} ways) and does "
                    f"not divide by {ways}. DTensor would lay it out differently from GSPMD (it rounds up once per "
                    f"axis); pad dim {dim} to a multiple of {ways}, or split it over one mesh axis."
                )
        if list(axes) == sorted(axes):
            for a in axes:
                placements[a] = Shard(dim)
        elif len(axes) == 2:  # the later mesh axis is major: DTensor's right-to-left sharding
            first, second = sorted(axes)
            placements[first] = _StridedShard(dim, split_factor=mesh.mesh_shape[second])
            placements[second] = Shard(dim)
        else:
            raise ShardingError(
                f"{where}: dim {dim} is split over mesh axes {[mesh.axis_label(a) for a in axes]}, out of mesh order; "
                "DTensor can express at most two axes against mesh order. List them in mesh order."
            )
    return tuple(placements)


def spec_of(mesh: Any, placements: tuple[Any, ...], rank: int) -> PartitionSpec:
    """The `PartitionSpec` of DTensor ``placements`` on ``mesh`` for a tensor of ``rank`` dims.

    Raises:
        ShardingError: a ``Partial`` placement (a pending sum has no layout of its own) or a
            strided shard that no spec gives.
    """
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    per_dim: dict[int, list[tuple[int, Any]]] = {}
    for axis, p in enumerate(placements):
        label = mesh.axis_label(axis)
        if isinstance(p, Shard):  # _StridedShard included
            per_dim.setdefault(p.dim, []).append((axis, p))
        elif isinstance(p, Partial):
            raise ShardingError(
                f"The DTensor is Partial ({p}) on mesh axis {label!r}: a pending reduction, not a layout. Redistribute "
                "it (mark_sharding or with_sharding_constraint) first."
            )
        elif not isinstance(p, Replicate):
            raise ShardingError(f"Placement {p!r} on mesh axis {label!r} has no PartitionSpec.")
    out: list[Any] = [None] * rank
    for dim, items in per_dim.items():
        axes = [a for a, _ in items]
        if any(isinstance(p, _StridedShard) for _, p in items):
            (first, strided), *rest = items
            if not isinstance(strided, _StridedShard) or len(rest) != 1 or isinstance(rest[0][1], _StridedShard):
                raise ShardingError(f"Placements {placements} shard dim {dim} in a way no PartitionSpec gives.")
            axes = [rest[0][0], first]  # the strided (earlier) mesh axis is the minor one
        labels = [mesh.axis_label(a) for a in axes]
        out[dim] = labels[0] if len(labels) == 1 else tuple(labels)
    return PartitionSpec(*out)


_NO_PROCESS_GROUP = (
    "the dtensor backend needs torch.distributed: launch with torchrun and call "
    "torch.distributed.init_process_group() (backend 'gloo' on CPU) before sharding."
)


class DTensorBackend:
    """`ShardingBackend` on DTensor: a sharding is a DTensor's placements over a DeviceMesh."""

    name = "dtensor"
    more_devices = "launch one process per device: torchrun --nproc_per_node n (on k hosts, --nnodes k, n per host)"

    def accepts(self, t: torch.Tensor) -> bool:
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):
            return True
        dist = _dist()
        return isinstance(t, torch.Tensor) and dist.is_available() and dist.is_initialized() and t.device.type != "xla"

    def refusal(self, t: torch.Tensor, context: str) -> Exception:
        from spmd.errors import SpmdTypeError

        dist = _dist()
        if not (dist.is_available() and dist.is_initialized()):
            return SpmdTypeError(f"{context}: {_NO_PROCESS_GROUP}")
        return SpmdTypeError(
            f"{context}: it is on device '{t.device}', an XLA device, and the dtensor backend shards tensors of "
            "torch.distributed's devices (CPU, CUDA, TorchTPU's tpu). Shard XLA tensors with "
            "spmd.use_backend('torch_xla'), or create the tensor on this process's device."
        )

    def device_count(self) -> int:
        dist = _dist()
        if not (dist.is_available() and dist.is_initialized()):
            from spmd.errors import SpmdTypeError

            raise SpmdTypeError(_NO_PROCESS_GROUP)
        return dist.get_world_size()

    def shard(self, t: torch.Tensor, sharding: NamedSharding, hlo: HloSharding, *, replace: bool) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, distribute_tensor

        placements = placements_for(sharding.mesh, sharding.spec, tuple(t.shape))
        if isinstance(t, DTensor):
            existing = self.sharding_of(t)
            if existing == hlo:
                return t
            if existing is not None and existing.kind is not ShardingKind.REPLICATED and not replace:
                raise ShardingConflictError(
                    f"mark_sharding: the DTensor of shape {tuple(t.shape)} is already sharded as {existing}; spec "
                    f"{sharding.spec!r} over {sharding.mesh.describe()} asks for {hlo}. Pass replace=True to "
                    "redistribute it."
                )
            return t.redistribute(device_mesh(sharding.mesh, t.device_mesh.device_type), placements)
        mesh = device_mesh(sharding.mesh, device_type_of(t))
        return distribute_tensor(t.detach() if not t.requires_grad else t, mesh, placements)

    def constrain(self, t: torch.Tensor, sharding: NamedSharding, hlo: HloSharding) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if not isinstance(t, DTensor):
            return self.shard(t, sharding, hlo, replace=True)
        # Always a redistribute, even to the layout ``t`` has: its backward lays the gradient out
        # as ``t`` was, which is what keeps DTensor's propagation on a layout it can follow (a
        # row-parallel projection otherwise sends a head-sharded gradient into attention, whose
        # batched matmul DTensor cannot flatten; examples/train_spmd.py).
        placements = placements_for(sharding.mesh, sharding.spec, tuple(t.shape))
        return t.redistribute(device_mesh(sharding.mesh, t.device_mesh.device_type), placements)

    def clear(self, t: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Replicate

        if not isinstance(t, DTensor):
            return t  # a plain tensor has no layout to clear
        # A DTensor's layout is its type, not an annotation: the value comes back replicated.
        return t.redistribute(t.device_mesh, [Replicate()] * t.device_mesh.ndim)

    def sharding_of(self, t: torch.Tensor) -> HloSharding | None:
        from torch.distributed.tensor import DTensor

        if not isinstance(t, DTensor):
            return None
        mesh = mesh_of(t.device_mesh)
        spec = spec_of(mesh, tuple(t.placements), t.dim())
        return hlo_sharding_for(mesh, spec, t.dim(), tuple(t.shape))


def mesh_of(device_mesh: Any) -> Any:
    """Our `Mesh` for a ``DeviceMesh`` (the same ranks, order and axis names)."""
    from mesh import Mesh

    ids = np.asarray(device_mesh.mesh.tolist())
    names = tuple(device_mesh.mesh_dim_names) if device_mesh.mesh_dim_names else None
    return Mesh(ids.reshape(-1), ids.shape, names)
