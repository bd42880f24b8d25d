"""Sharding as values: partition specs, named shardings, XLA's HLO shardings, and DTensor
placements. Pure math over a `mesh.Mesh`: nothing here asks a runtime.

The implementation modules are private; import from here (or from ``spmd``).
"""

from mesh.naming import publish
from spmd.sharding._hlo_sharding import HloSharding as HloSharding
from spmd.sharding._hlo_sharding import ShardBounds as ShardBounds
from spmd.sharding._hlo_sharding import ShardingKind as ShardingKind
from spmd.sharding._hlo_sharding import iota_device_ids as iota_device_ids
from spmd.sharding._named_sharding import NamedSharding as NamedSharding
from spmd.sharding._named_sharding import hlo_sharding_for as hlo_sharding_for
from spmd.sharding._named_sharding import resolve_spec as resolve_spec
from spmd.sharding._partition_spec import P as P
from spmd.sharding._partition_spec import PartitionSpec as PartitionSpec
from spmd.sharding._partition_spec import SpecEntry as SpecEntry
from spmd.sharding._partition_spec import spec_on_largest_dim as spec_on_largest_dim
from spmd.sharding._placements import is_placements as is_placements
from spmd.sharding._placements import placements_from_spec as placements_from_spec
from spmd.sharding._placements import spec_from_placements as spec_from_placements
from spmd.sharding._sharding_type import ShardingType as ShardingType
from spmd.sharding._sharding_type import sharding_type_of as sharding_type_of

__all__ = [
    "HloSharding",
    "NamedSharding",
    "P",
    "PartitionSpec",
    "ShardBounds",
    "ShardingKind",
    "ShardingType",
    "SpecEntry",
    "hlo_sharding_for",
    "iota_device_ids",
    "is_placements",
    "placements_from_spec",
    "resolve_spec",
    "sharding_type_of",
    "spec_from_placements",
    "spec_on_largest_dim",
]

# Reprs, pickles and docs name the public path, as jax sets NamedSharding.__module__ = "jax.sharding";
# pickles that name the private module still load (the class lives on there);
# `mesh.naming.publish` resolves their annotations first, so typing.get_type_hints still works.
publish(__name__, HloSharding, NamedSharding, PartitionSpec, ShardBounds, ShardingKind, ShardingType)
