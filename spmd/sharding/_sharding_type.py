"""`ShardingType`: torch_xla's names for XLA's ``OpSharding.Type``, and the type of an `HloSharding`."""

from __future__ import annotations

import enum

from spmd.sharding._hlo_sharding import HloSharding, ShardingKind

__all__ = ["ShardingType", "sharding_type_of"]


class ShardingType(enum.IntEnum):
    """XLA's ``OpSharding.Type`` values under torch_xla's names (``xs.ShardingType``).

    ``PARTIAL`` is a tiled sharding whose blocks are each held by several devices (XLA's
    ``last_tile_dim_replicate``); ``UNKNOWN`` is torch_xla's implicit replication.
    """

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


def sharding_type_of(hlo: HloSharding) -> ShardingType:
    """The `ShardingType` of ``hlo``.

    Example:
        >>> sharding_type_of(HloSharding.parse("{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"))
        <ShardingType.PARTIAL: 5>
    """
    if hlo.kind is ShardingKind.TILED:
        return ShardingType.PARTIAL if hlo.replication > 1 else ShardingType.TILED
    return {
        ShardingKind.REPLICATED: ShardingType.REPLICATED,
        ShardingKind.MAXIMAL: ShardingType.MAXIMAL,
        ShardingKind.MANUAL: ShardingType.MANUAL,
    }[hlo.kind]
