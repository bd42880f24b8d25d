"""Exceptions raised for an invalid mesh; each is a ValueError or TypeError subclass."""

from __future__ import annotations

__all__ = ["MeshError", "MeshTypeError", "DeviceCountError", "NoMeshError"]


class MeshError(ValueError):
    """A mesh's shape, axis names or device ids are inconsistent."""


class MeshTypeError(TypeError):
    """A mesh argument has the wrong type."""


class DeviceCountError(MeshError):
    """A mesh names more (or other) devices than the runtime has."""


class NoMeshError(MeshError):
    """An operation needs a mesh, none was passed and no global mesh is set."""
