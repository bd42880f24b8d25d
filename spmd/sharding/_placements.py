"""DTensor's placements and our `PartitionSpec`, both ways.

A placement list has one entry per mesh axis (``Shard(dim)``, ``Replicate()``; DTensor's
``Partial()`` is a pending sum, not a layout); a spec has one entry per tensor dim (the mesh axes
splitting it). ``[Replicate(), Shard(0)]`` over a (2, 4) mesh is ``P(1, None)`` (torch_xla's
``convert_to_xla_partition_spec`` rule), or ``P('model', None)`` where the second axis is named
``model``. Several ``Shard(d)`` on one dim list their mesh axes in mesh order, the first major,
which is how DTensor splits (left to right) and how GSPMD reads a tuple entry; a dim split
against mesh order is ``_StridedShard`` on the earlier axis (DTensor's right-to-left sharding,
two axes at most). Pure conversion: no runtime, no process group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mesh import Mesh, MeshTypeError
from mesh.checks import is_int, require_bool
from spmd._util import torch_compat
from spmd.errors import PartialPlacementError, PlacementDimError, PlacementError, ShardingError, SpmdTypeError
from spmd.sharding._named_sharding import resolve_spec
from spmd.sharding._partition_spec import PartitionSpec

__all__ = [
    "PartialPlacementError",
    "PlacementDimError",
    "PlacementError",
    "is_placements",
    "placements_from_spec",
    "spec_from_placements",
]


def _placement_types() -> tuple[type, type, type]:
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor.placement_types import Placement

    return Placement, Replicate, Partial


def is_placements(value: object) -> bool:
    """Whether ``value`` is a non-empty sequence of DTensor placements (not a spec)."""
    if isinstance(value, (str, bytes, PartitionSpec)) or not isinstance(value, Sequence) or not value:
        return False
    placement = _placement_types()[0]
    return all(isinstance(p, placement) for p in value)


_MAX_RANK = 63  # numpy's 64 dims less the replication dim, as `resolve_spec` allows


def _check_arguments(placements: object, mesh: object, rank: object) -> list[Any]:
    """The placements as a list, after checking the three arguments' types (no placement math)."""
    if not isinstance(mesh, Mesh):
        raise MeshTypeError(f"spec_from_placements needs a Mesh, got {mesh!r:.80} ({type(mesh).__name__}).")
    if not is_int(rank):
        raise SpmdTypeError(f"rank is an int (the tensor's number of dims), got {rank!r:.80} ({type(rank).__name__}).")
    if not 0 <= rank <= _MAX_RANK:
        raise PlacementError(f"rank is the tensor's number of dims, 0 to {_MAX_RANK}; got {rank}.")
    if isinstance(placements, (str, bytes, PartitionSpec)) or not isinstance(placements, Sequence):
        raise PlacementError(
            f"placements are a sequence of Shard(dim)/Replicate(), one per axis of {mesh.describe()}; got "
            f"{placements!r:.80} ({type(placements).__name__})."
        )
    return list(placements)


def _shard_dim(p: Any, rank: int, where: str) -> int:
    """The tensor dim a ``Shard`` splits, checked against ``rank``."""
    if not is_int(p.dim):
        raise PlacementError(f"{where}: {p!r:.80} splits dim {p.dim!r:.40}; Shard takes an int tensor dim.")
    dim = p.dim + rank if p.dim < 0 else p.dim
    if not 0 <= dim < rank:
        raise PlacementDimError(
            f"Shard dimension {p.dim} is out of bounds for tensor with {rank} dimensions ({where})."
        )
    return int(dim)


def spec_from_placements(placements: Sequence[Any], mesh: Mesh, rank: int, *, by_index: bool = False) -> PartitionSpec:
    """The `PartitionSpec` of ``placements`` (one per axis of ``mesh``) for a tensor of ``rank``
    dims. Entries name mesh axes by name where the mesh has names, else (or with ``by_index``)
    by index, as torch_xla's specs do.

    Raises:
        PlacementError: not one placement per mesh axis, or not a placement.
        MeshTypeError: ``mesh`` is not a `Mesh`.
        PartialPlacementError: a ``Partial()``.
        PlacementDimError: a ``Shard(dim)`` beyond the tensor's dims.
        SpmdTypeError: ``by_index`` is not a bool (``'no'`` would name axes by index).
    """
    require_bool(by_index, "spec_from_placements: by_index", SpmdTypeError)
    placement, replicate, partial = _placement_types()
    placements = _check_arguments(placements, mesh, rank)
    where = f"placements {placements!s:.300} over {mesh.describe()}"
    if len(placements) != mesh.ndim:
        raise PlacementError(
            f"Number of placements ({len(placements)}) must match mesh dimensions ({mesh.ndim}): {where}. Give one "
            "placement per mesh axis (Replicate() for an axis that does not split the tensor)."
        )
    per_dim: dict[int, list[int]] = {}
    strided: dict[int, int] = {}
    for axis, p in enumerate(placements):
        if isinstance(p, partial):
            raise PartialPlacementError(
                f"{where}: Partial placement is not implemented: a pending sum is not a layout. Use Shard or Replicate "
                "placements (redistribute a Partial DTensor to Replicate() first)."
            )
        if torch_compat.is_shard(p):
            dim = _shard_dim(p, rank, where)
            per_dim.setdefault(dim, []).append(axis)
            if torch_compat.is_strided_shard(p):
                strided[dim] = axis
        elif not isinstance(p, (replicate, placement)):
            raise PlacementError(f"{where}: {p!r} is not a placement (Shard(d), Replicate()).")
    label = (lambda a: a) if by_index or mesh.axis_names is None else mesh.axis_label
    entries: list[Any] = [None] * rank
    for dim, axes in per_dim.items():
        if dim in strided:  # the strided (earlier) mesh axis is the minor one
            axes = [a for a in axes if a != strided[dim]] + [strided[dim]]
        labels = [label(a) for a in axes]
        entries[dim] = labels[0] if len(labels) == 1 else tuple(labels)
    return PartitionSpec(*entries)


def placements_from_spec(spec: PartitionSpec | Sequence[Any], mesh: Mesh, rank: int) -> tuple[Any, ...]:
    """DTensor placements (one per axis of ``mesh``) that lay a tensor of ``rank`` dims out as
    ``spec``; axes of size 1 split nothing and stay ``Replicate()``.

    Raises:
        ShardingError: the spec does not fit the mesh, or splits one dim over more than two
            mesh axes against mesh order (no placement holds that).
    """
    from torch.distributed.tensor import Replicate, Shard

    spec = PartitionSpec.from_value(spec)
    placements: list[Any] = [Replicate() for _ in range(mesh.ndim)]
    for dim, named in enumerate(resolve_spec(mesh, spec, rank)):
        axes = [a for a in named if mesh.mesh_shape[a] > 1]
        if axes == sorted(axes):
            for a in axes:
                placements[a] = Shard(dim)
        elif len(axes) == 2:  # the later mesh axis is major: DTensor's right-to-left sharding
            first, second = sorted(axes)
            placements[first] = torch_compat.strided_shard(dim, mesh.mesh_shape[second])
            placements[second] = Shard(dim)
        else:
            raise ShardingError(
                f"spec {spec!r} over {mesh.describe()}: dim {dim} is split over mesh axes "
                f"{[mesh.axis_label(a) for a in axes]}, out of mesh order; DTensor placements express at most two "
                "axes against mesh order. List them in mesh order."
            )
    return tuple(placements)
