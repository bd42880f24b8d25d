"""The global mesh: a process-wide default plus a thread-local stack of scoped meshes.

Runtimes that keep a global mesh of their own (torch_xla's, which its FSDPv2 and the Hugging
Face Trainer read) follow ours through a `GlobalMeshFollower` that the backend's package
registers (`follow_global_mesh`): this module imports nothing above it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from mesh._checks import require_int
from mesh._mesh import Mesh
from mesh.errors import DeviceCountError, MeshTypeError, NoMeshError

__all__ = [
    "GlobalMeshFollower",
    "as_mesh",
    "follow_global_mesh",
    "get_1d_mesh",
    "get_global_mesh",
    "mesh_or_global",
    "set_global_mesh",
    "use_mesh",
]


class GlobalMeshFollower(Protocol):
    """A runtime's own global mesh, kept equal to ours."""

    def set(self, mesh: Mesh | None) -> None:
        """Make the backend's global mesh ``mesh`` (``None`` clears it)."""
        ...

    def current(self) -> Mesh | None:
        """The runtime's global mesh as a `Mesh`, or ``None`` when it has none."""
        ...


# The only module-level mutable state in the product, by design: the explicit global mesh
# (and the backends that follow it, registered once at import).
_process_default: Mesh | None = None
_scoped = threading.local()
_followers: list[GlobalMeshFollower] = []


def follow_global_mesh(follower: GlobalMeshFollower) -> None:
    """Keep ``follower``'s global mesh equal to ours from now on."""
    if follower not in _followers:
        _followers.append(follower)
        follower.set(_process_default)


def _stack() -> list[Mesh]:
    if not hasattr(_scoped, "meshes"):
        _scoped.meshes = []
    return _scoped.meshes


def set_global_mesh(mesh: Mesh | None) -> None:
    """Set (or with ``None`` clear) the process-wide default mesh.

    Runtimes that follow it (torch_xla's global mesh, once ``spmd`` is imported) are set too, so
    torch_xla code that reads its global mesh (FSDPv2, the Trainer's ``xla_fsdp_v2`` path) sees it.
    """
    global _process_default
    if mesh is not None:
        mesh = as_mesh(mesh, "set_global_mesh")
    _process_default = mesh
    for follower in _followers:
        follower.set(mesh)


def get_global_mesh() -> Mesh | None:
    """The innermost `use_mesh` mesh of this thread, else the process default, else a
    following runtime's global mesh set there after ours (torch_xla's ``xs.set_global_mesh``:
    the latest call wins), else ``None``."""
    stack = _stack()
    if stack:
        return stack[-1]
    for follower in _followers:
        theirs = follower.current()
        if theirs is not None and theirs != _process_default:
            return theirs
    return _process_default


@contextlib.contextmanager
def use_mesh(mesh: Mesh) -> Iterator[Mesh]:
    """Make ``mesh`` the current mesh of this thread inside the ``with`` block.

    Example:
        >>> import numpy as np
        >>> with use_mesh(Mesh(np.arange(8), (8,), ("data",))) as m:
        ...     assert get_global_mesh() is m
    """
    mesh = as_mesh(mesh, "use_mesh")
    stack = _stack()
    stack.append(mesh)
    try:
        yield mesh
    finally:
        stack.pop()


_MAX_1D_DEVICES = 2**20
"""More devices than any pod has: a larger count is a typo, and its ``arange`` would not fit in memory."""


def get_1d_mesh(axis_name: str | None = None, num_devices: int | None = None) -> Mesh:
    """A one-axis mesh over ``num_devices`` devices (``spmd.get_1d_mesh`` takes the backend's
    count when it is not given).

    Raises:
        MeshTypeError: ``num_devices`` is not given, or not an int.
        DeviceCountError: ``num_devices`` is below 1 or above 2**20 (``2**70`` was numpy's own
            "Maximum allowed size exceeded").
    """
    if num_devices is None:
        raise MeshTypeError(
            "mesh.get_1d_mesh needs num_devices (a Mesh is a value; it does not ask a runtime). "
            "spmd.get_1d_mesh(axis_name) takes the runtime's device count."
        )
    num_devices = require_int(  # a numpy int is one too
        num_devices, "num_devices", MeshTypeError, minimum=1, maximum=_MAX_1D_DEVICES, range_error=DeviceCountError
    )
    return Mesh(np.arange(num_devices), (num_devices,), None if axis_name is None else (axis_name,))


def mesh_or_global(mesh: Mesh | None, what: str) -> Mesh:
    """``mesh``, or the current global mesh when it is ``None``.

    Args:
        mesh: the mesh the caller was given (a `Mesh`, torch_xla's, or a ``DeviceMesh``).
        what: the call, for the message (``"mark_sharding(tensor of shape (8, 4), P('x'))"``).

    Raises:
        NoMeshError: ``mesh`` is ``None`` and no global mesh is set.
        MeshTypeError: ``mesh`` is not a mesh.
    """
    if mesh is None:
        mesh = get_global_mesh()
        if mesh is None:
            raise NoMeshError(
                f"{what} got no mesh and no global mesh is set. Pass one (e.g. mesh=Mesh(np.arange(n), (n,), "
                "('data',))), or call mesh.set_global_mesh(...) / use `with use_mesh(...)`."
            )
    return as_mesh(mesh, what)


def as_mesh(mesh: object, what: str) -> Mesh:
    """``mesh`` as our `Mesh`: ours as it is; torch_xla's ``Mesh`` and torch.distributed's
    ``DeviceMesh`` converted (the same ids, shape and names).

    Raises:
        MeshTypeError: none of those.
    """
    if isinstance(mesh, Mesh):
        return mesh
    ours = Mesh.from_torch_xla(mesh)
    if ours is not None:
        return ours
    if hasattr(mesh, "mesh_dim_names") and hasattr(getattr(mesh, "mesh", None), "tolist"):
        return Mesh.from_device_mesh(mesh)
    raise MeshTypeError(
        f"{what} expects a mesh.Mesh (or a torch_xla Mesh, or a torch.distributed DeviceMesh), got "
        f"{type(mesh).__module__}.{type(mesh).__name__}. Build one: Mesh(np.arange(n), (n,), ('data',))."
    )
