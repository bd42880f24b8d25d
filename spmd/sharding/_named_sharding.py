"""`NamedSharding` (mesh + spec) and the pure math from it to an XLA `HloSharding`.

The rule is JAX's (``NamedSharding._to_xla_hlo_sharding``) and torch_xla's
(``Mesh.get_op_sharding``), which agree: permute the mesh so the axes the spec names come
first, in spec order, and the axes it does not name come last; merge the axes of each tensor
dim into one tile dim; merge the unnamed axes into one replication dim. No torch_xla here.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mesh import Mesh, MeshTypeError
from mesh.checks import is_int
from mesh.errors import MeshError
from spmd.errors import AxisIndexError, DuplicateAxisError, SpecRankError, UnknownAxisError
from spmd.sharding._hlo_sharding import HloSharding, ShardBounds
from spmd.sharding._partition_spec import PartitionSpec

__all__ = ["NamedSharding", "resolve_spec", "hlo_sharding_for"]

# numpy arrays have at most 64 dims; a tile assignment has one per tensor dim plus one to replicate.
_MAX_RANK = 63

# Distinct (mesh, spec, rank, shape) a program converts: a model has a few hundred parameters.
_CACHE_SIZE = 4096


def torch_size_type() -> type:
    """``torch.Size`` when torch is loaded (shapes come as one), else ``tuple`` (no torch import here)."""
    torch = sys.modules.get("torch")
    return torch.Size if torch is not None else tuple


def _once(cached: Callable, *args: object) -> object:
    """``cached(*args)`` through its cache; while torch.compile traces, the function itself
    (Dynamo traces through a cache anyway, and warns when it meets one)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        return cached.__wrapped__(*args)
    return cached(*args)


def _context(mesh: Mesh, spec: PartitionSpec, shape: Sequence[int] | None, rank: int) -> str:
    tensor = f"tensor of shape {tuple(shape)}" if shape is not None else f"rank-{rank} tensor"
    return f"{tensor}, spec {spec!r}, {mesh.describe()}"


def _check_rank_and_shape(rank: object, shape: object) -> None:
    """``rank`` an int 0..63 and ``shape`` (if given) that many sizes >= 0, or SpecRankError."""
    if not is_int(rank) or not 0 <= rank <= _MAX_RANK:
        raise SpecRankError(f"rank must be an int from 0 to {_MAX_RANK} (a tensor's number of dims), got {rank!r:.80}.")
    if shape is not None:
        dims = tuple(shape) if isinstance(shape, (tuple, list, torch_size_type())) else None
        if dims is None or len(dims) != rank or not all(is_int(n) and n >= 0 for n in dims):
            raise SpecRankError(
                f"shape must be {rank} non-negative ints (one per dim of the rank-{rank} tensor), got {shape!r:.200}."
            )


def resolve_spec(
    mesh: Mesh, spec: PartitionSpec | Sequence[object], rank: int, shape: Sequence[int] | None = None
) -> tuple[tuple[int, ...], ...]:
    """The mesh axis indices sharding each of the ``rank`` tensor dims.

    Raises:
        SpecRankError: the spec is longer than ``rank``.
        UnknownAxisError: a name is not a mesh axis.
        AxisIndexError: an integer axis is out of range.
        DuplicateAxisError: a mesh axis is used twice (e.g. by name and by index).
        MeshTypeError: ``mesh`` is not a `Mesh`.
        PartitionSpecTypeError: ``spec`` is not a `PartitionSpec` or a tuple of entries.
    """
    if not isinstance(mesh, Mesh):
        swapped = " (mesh and spec are swapped?)" if isinstance(spec, Mesh) else ""
        raise MeshTypeError(
            f"resolve_spec(mesh, spec, rank) needs a Mesh first, got {mesh!r:.80} ({type(mesh).__name__}){swapped}."
        )
    spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec.from_value(spec)
    _check_rank_and_shape(rank, shape)
    where = _context(mesh, spec, shape, rank)
    if len(spec) > rank:
        fix = "For a scalar the spec is P()." if rank == 0 else f"Give at most {rank} entries, one per dim."
        raise SpecRankError(f"{where}: the spec has {len(spec)} entries but the tensor has {rank} dims. {fix}")
    out: list[tuple[int, ...]] = []
    used: dict[int, object] = {}
    for entry in spec.padded(rank):
        axes: list[int] = []
        for axis in () if entry is None else entry if isinstance(entry, tuple) else (entry,):
            try:
                idx = mesh.axis_index(axis)
            except MeshError:
                if isinstance(axis, str):
                    raise UnknownAxisError(
                        f"{where}: mesh axis {axis!r} is not in the mesh. Use one of "
                        f"{list(mesh.shape().keys())}, or None to replicate that dim."
                    ) from None
                raise AxisIndexError(
                    f"{where}: mesh axis index {axis} is out of range; the mesh has axes "
                    f"0..{mesh.ndim - 1} ({list(mesh.shape().keys())})."
                ) from None
            if idx in used:
                raise DuplicateAxisError(
                    f"{where}: mesh axis {mesh.axis_label(idx)!r} is used twice (as {used[idx]!r} "
                    f"and {axis!r}); a mesh axis can shard at most one tensor dim."
                )
            used[idx] = axis
            axes.append(idx)
        out.append(tuple(axes))
    return tuple(out)


def hlo_sharding_for(
    mesh: Mesh, spec: PartitionSpec | Sequence[object], rank: int, shape: Sequence[int] | None = None
) -> HloSharding:
    """The XLA sharding that ``(mesh, spec)`` gives a tensor of ``rank`` dims.

    A one-device mesh gives a maximal sharding on that device (as torch_xla does); a spec
    that shards nothing (or only over size-1 axes) gives a replicated one. A pure function of
    hashable values, so it is cached (as JAX caches its conversion): a `Mesh`, a
    `PartitionSpec` and Python ints are converted once; other arguments (a tuple spec, a numpy
    int) are checked and converted each time.

    Example:
        >>> import numpy as np
        >>> mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
        >>> str(hlo_sharding_for(mesh, PartitionSpec("data"), 2))
        '{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'
    """
    key = _cache_key(mesh, spec, rank, shape)
    if key is None:
        return _compute_hlo_sharding(mesh, spec, rank, shape)
    return _once(_cached_hlo_sharding, *key)  # type: ignore[return-value]


def _cache_key(mesh: object, spec: object, rank: object, shape: object) -> tuple | None:
    """The arguments as a cache key, or None when they are not exactly a `Mesh`, a
    `PartitionSpec` and Python ints: ``True == 1`` and ``2.0 == 2`` hash alike, and a cache keyed
    on them would give a bool rank the result of 1 instead of its error."""
    if not (isinstance(mesh, Mesh) and isinstance(spec, PartitionSpec) and type(rank) is int):
        return None
    if shape is None:
        return mesh, spec, rank, None
    if isinstance(shape, tuple) and all(type(n) is int for n in shape):  # torch.Size is a tuple
        return mesh, spec, rank, tuple(shape)
    return None


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _cached_hlo_sharding(mesh: Mesh, spec: PartitionSpec, rank: int, shape: tuple[int, ...] | None) -> HloSharding:
    return _compute_hlo_sharding(mesh, spec, rank, shape)


def _compute_hlo_sharding(
    mesh: Mesh, spec: PartitionSpec | Sequence[object], rank: int, shape: Sequence[int] | None
) -> HloSharding:
    """`hlo_sharding_for` without the cache: check, then convert."""
    dims = resolve_spec(mesh, spec, rank, shape)
    if mesh.size() == 1:
        return HloSharding.maximal(int(mesh.device_ids[0]))
    sizes = mesh.mesh_shape
    named = [a for axes in dims for a in axes]
    unnamed = [a for a in range(mesh.ndim) if a not in named]
    # Lists, not generators: torch.compile's Dynamo cannot trace math.prod over a generator, and
    # broke the graph at every with_sharding_constraint inside a compiled function.
    tile_shape = [math.prod([sizes[a] for a in axes]) for axes in dims]
    replication = math.prod([sizes[a] for a in unnamed])
    if math.prod(tile_shape) == 1:
        return HloSharding.replicated()
    assignment = mesh.get_logical_mesh().transpose(named + unnamed)
    if replication == 1:
        return HloSharding.tiled(assignment.reshape(tile_shape))
    return HloSharding.tiled(assignment.reshape(tile_shape + [replication]), replicate_last_dim=True)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _check_spec_on_mesh(mesh: Mesh, spec: PartitionSpec) -> None:
    """Every axis ``spec`` names is in ``mesh``, once (a check, not a conversion: the tensor's
    rank and shape come later, with `hlo_sharding_for`)."""
    resolve_spec(mesh, spec, len(spec))


@dataclass(frozen=True)
class NamedSharding:
    """A sharding given by a mesh and a partition spec, like ``jax.sharding.NamedSharding``.

    Example:
        >>> import numpy as np
        >>> from mesh import Mesh
        >>> s = NamedSharding(Mesh(np.arange(8), (8,), ("x",)), PartitionSpec("x"))
        >>> s.shard_shape((16, 4))
        (2, 4)
    """

    mesh: Mesh
    spec: PartitionSpec

    def __post_init__(self) -> None:
        if isinstance(self.spec, Mesh) and isinstance(self.mesh, (PartitionSpec, tuple, list)):
            raise MeshTypeError(
                "NamedSharding(spec, mesh): the two are swapped; the order is NamedSharding(mesh, spec)."
            )
        if not isinstance(self.mesh, Mesh):
            raise MeshTypeError(f"NamedSharding needs a Mesh, got {type(self.mesh).__name__}.")
        if not isinstance(self.spec, PartitionSpec):
            object.__setattr__(self, "spec", PartitionSpec.from_value(self.spec))
        _once(_check_spec_on_mesh, self.mesh, self.spec)  # checked when built (JAX's rule), not at first use

    def hlo_sharding(self, rank: int, shape: Sequence[int] | None = None) -> HloSharding:
        """The XLA sharding for a tensor of ``rank`` dims (see `hlo_sharding_for`)."""
        return hlo_sharding_for(self.mesh, self.spec, rank, shape)

    def shard_bounds(self, global_shape: Sequence[int]) -> list[ShardBounds]:
        """The block each mesh device holds, in mesh device order."""
        hlo = self.hlo_sharding(len(global_shape), global_shape)
        return hlo.shard_bounds(global_shape, self.mesh.device_ids.tolist())

    def shard_shape(self, global_shape: Sequence[int]) -> tuple[int, ...]:
        """The per-device block shape, including XLA's padding of uneven dims."""
        dims = resolve_spec(self.mesh, self.spec, len(global_shape), global_shape)
        sizes = self.mesh.mesh_shape
        return tuple(-(-n // math.prod(sizes[a] for a in axes)) for n, axes in zip(global_shape, dims))

    def is_fully_replicated(self, rank: int) -> bool:
        """Whether every device holds the whole tensor."""
        return self.hlo_sharding(rank).is_replicated or self.mesh.size() == 1

    def __repr__(self) -> str:
        return f"NamedSharding({self.mesh.describe()}, {self.spec!r})"
