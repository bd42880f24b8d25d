"""The global mesh: a process-wide default plus a thread-local stack of scoped meshes."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np

from mesh._mesh import Mesh
from mesh.errors import MeshTypeError, NoMeshError

__all__ = ["set_global_mesh", "get_global_mesh", "use_mesh", "get_1d_mesh", "mesh_or_global"]

# The only module-level mutable state in the product, by design: the explicit global mesh.
_process_default: Mesh | None = None
_scoped = threading.local()


def _stack() -> list[Mesh]:
    if not hasattr(_scoped, "meshes"):
        _scoped.meshes = []
    return _scoped.meshes


def set_global_mesh(mesh: Mesh | None) -> None:
    """Set (or with ``None`` clear) the process-wide default mesh.

    torch_xla's global mesh becomes the same object, so torch_xla code that reads it (its FSDPv2
    ``SpmdFullyShardedDataParallel``, the Hugging Face Trainer's ``xla_fsdp_v2`` path) sees it.
    """
    global _process_default
    if mesh is not None:
        mesh = _as_mesh(mesh, "set_global_mesh")
    _process_default = mesh
    from spmd._backend import backend  # torch_xla's global mesh: a torch_xla-only operation

    backend.mirror_global_mesh(mesh)


def get_global_mesh() -> Mesh | None:
    """The innermost `use_mesh` mesh of this thread, else the process default, else torch_xla's
    global mesh (set by torch_xla's ``xs.set_global_mesh``, as our `Mesh`), else ``None``."""
    stack = _stack()
    if stack:
        return stack[-1]
    from spmd._backend import backend

    # One global mesh: ours is mirrored into torch_xla's, so when theirs is another object,
    # torch_xla's own set_global_mesh was called after ours, and the latest call wins.
    theirs = backend.global_mesh()
    if theirs is None or theirs is _process_default:
        return _process_default
    return Mesh.from_torch_xla(theirs)


@contextlib.contextmanager
def use_mesh(mesh: Mesh) -> Iterator[Mesh]:
    """Make ``mesh`` the current mesh of this thread inside the ``with`` block.

    Example:
        >>> import numpy as np
        >>> with use_mesh(Mesh(np.arange(8), (8,), ("data",))) as m:
        ...     assert get_global_mesh() is m
    """
    mesh = _as_mesh(mesh, "use_mesh")
    stack = _stack()
    stack.append(mesh)
    try:
        yield mesh
    finally:
        stack.pop()


def get_1d_mesh(axis_name: str | None = None, num_devices: int | None = None) -> Mesh:
    """A one-axis mesh over all devices (``num_devices``, default: the runtime's count)."""
    if num_devices is None:
        from spmd._backend import backend_for  # the one home of the device count

        num_devices = backend_for().device_count()
    n = int(num_devices)
    return Mesh(np.arange(n), (n,), None if axis_name is None else (axis_name,))


def mesh_or_global(mesh: Mesh | None, what: str) -> Mesh:
    """``mesh``, or the current global mesh when it is ``None``.

    Args:
        mesh: the mesh the caller was given.
        what: the call, for the message (``"mark_sharding(tensor of shape (8, 4), P('x'))"``).

    Raises:
        NoMeshError: ``mesh`` is ``None`` and no global mesh is set.
        MeshTypeError: ``mesh`` is not a `Mesh`.
    """
    if mesh is None:
        mesh = get_global_mesh()
        if mesh is None:
            raise NoMeshError(
                f"{what} got no mesh and no global mesh is set. Pass one (e.g. mesh=Mesh(np.arange(n), (n,), "
                "('data',))), or call mesh.set_global_mesh(...) / use `with use_mesh(...)`."
            )
    return _as_mesh(mesh, what)


def _as_mesh(mesh: object, what: str) -> Mesh:
    """``mesh`` as our `Mesh` (a torch_xla mesh is converted: same ids, shape and names)."""
    ours = Mesh.from_torch_xla(mesh)
    if ours is None:
        raise MeshTypeError(
            f"{what} expects a mesh.Mesh (or a torch_xla Mesh), got {type(mesh).__module__}.{type(mesh).__name__}. "
            "Build one: Mesh(np.arange(n), (n,), ('data',))."
        )
    return ours
