"""The global mesh: a process-wide default plus a thread-local stack of scoped meshes."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np

from mesh._mesh import Mesh
from mesh._runtime import runtime_device_count

__all__ = ["set_global_mesh", "get_global_mesh", "use_mesh", "get_1d_mesh"]

# The only module-level mutable state in the product, by design: the explicit global mesh.
_process_default: Mesh | None = None
_scoped = threading.local()


def _stack() -> list[Mesh]:
    if not hasattr(_scoped, "meshes"):
        _scoped.meshes = []
    return _scoped.meshes


def set_global_mesh(mesh: Mesh | None) -> None:
    """Set (or with ``None`` clear) the process-wide default mesh, as torch_xla's does."""
    global _process_default
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"set_global_mesh expects a Mesh or None, got {type(mesh).__name__}.")
    _process_default = mesh


def get_global_mesh() -> Mesh | None:
    """The innermost `use_mesh` mesh of this thread, else the process default, else ``None``."""
    stack = _stack()
    return stack[-1] if stack else _process_default


@contextlib.contextmanager
def use_mesh(mesh: Mesh) -> Iterator[Mesh]:
    """Make ``mesh`` the current mesh of this thread inside the ``with`` block.

    Example:
        >>> import numpy as np
        >>> with use_mesh(Mesh(np.arange(8), (8,), ("data",))) as m:
        ...     assert get_global_mesh() is m
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"use_mesh expects a Mesh, got {type(mesh).__name__}.")
    stack = _stack()
    stack.append(mesh)
    try:
        yield mesh
    finally:
        stack.pop()


def get_1d_mesh(axis_name: str | None = None, num_devices: int | None = None) -> Mesh:
    """A one-axis mesh over all devices (``num_devices``, default: the runtime's count)."""
    n = runtime_device_count() if num_devices is None else int(num_devices)
    return Mesh(np.arange(n), (n,), None if axis_name is None else (axis_name,))
