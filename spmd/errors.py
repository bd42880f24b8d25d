"""Exceptions for invalid shardings; each a ValueError or TypeError subclass with a fix in its message."""

from __future__ import annotations

from mesh.errors import DeviceCountError

__all__ = [
    "ShardingError",
    "UnknownAxisError",
    "DuplicateAxisError",
    "SpecRankError",
    "AxisIndexError",
    "PartitionSpecTypeError",
    "NotAnXlaTensorError",
    "ShardingConflictError",
    "SpmdModeError",
    "DeviceCountError",
]


class ShardingError(ValueError):
    """A (mesh, partition spec, tensor) combination that cannot be sharded."""


class UnknownAxisError(ShardingError):
    """The spec names a mesh axis the mesh does not have."""


class DuplicateAxisError(ShardingError):
    """The spec uses one mesh axis for two tensor dims (or twice in one dim)."""


class SpecRankError(ShardingError):
    """The spec has more entries than the tensor has dims."""


class AxisIndexError(ShardingError):
    """An integer mesh axis in the spec is out of range."""


class PartitionSpecTypeError(TypeError):
    """A spec entry is not a mesh axis name, index, tuple of those, or ``None``."""


class NotAnXlaTensorError(TypeError):
    """The tensor is not on an XLA device, so it cannot carry an XLA sharding."""


class ShardingConflictError(ShardingError):
    """The tensor already carries a different sharding."""


class SpmdModeError(RuntimeError):
    """SPMD mode cannot be turned on any more: tensors were placed on the device without it."""
