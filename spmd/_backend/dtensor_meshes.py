"""``DeviceMesh``es for our meshes: built once per mesh, device type and world group, in
mesh-coordinate order where torch can order a group's members (permuted meshes, torch 2.13+),
with the world's collective timeout on every axis group, and released at exit while the
interpreter is whole (a DeviceMesh kept into finalization aborted the process)."""

from __future__ import annotations

import atexit
import gc
import time
import weakref
from typing import Any

import numpy as np
import torch

from spmd._util import torch_compat

__all__ = ["device_mesh"]


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _real_tensors() -> Any:
    """A context in which tensors are real even under a fake tensor mode (a dry run's,
    `spmd.inspector`): a mesh's rank ids are topology DeviceMesh reads back, not data."""
    from spmd._util.torch_compat import unset_fake_temporarily

    return unset_fake_temporarily()


def _bounded(values: list, limit: int = 300) -> str:
    text = str(values)
    return text if len(text) <= limit else text[: limit - 5] + " ...]"


def _increasing_along_every_axis(ids: np.ndarray) -> bool:
    return not any((np.diff(ids, axis=k) <= 0).any() for k in range(ids.ndim))


def device_mesh(mesh: Any, device_type: str) -> Any:
    """The ``DeviceMesh`` of ``mesh`` (built once per mesh, device type and process group:
    building one makes a process group per axis, collectively, so every rank must ask in the
    same order).

    Raises:
        MeshError: the ids do not increase along some axis and this torch cannot order a
            process group's members (torch 2.9).
    """
    from torch.distributed.device_mesh import DeviceMesh

    key = ("device_mesh", device_type, _dist().group.WORLD.group_name)
    if key not in mesh.memo:
        ids = mesh.get_logical_mesh()
        names = mesh.axis_names or tuple(f"axis{i}" for i in range(mesh.ndim))
        if _increasing_along_every_axis(ids):
            with _real_tensors():
                built = DeviceMesh(device_type, torch.as_tensor(ids), mesh_dim_names=names)
        elif torch_compat.ordered_groups_supported():
            with _real_tensors():
                built = torch_compat.device_mesh_from_ids(device_type, ids, names)
        else:
            from mesh import MeshError

            major, minor = torch_compat.TORCH_VERSION
            raise MeshError(
                f"{mesh.describe()} with device ids {_bounded(ids.tolist())} cannot be a DeviceMesh on torch "
                f"{major}.{minor}: its process groups order their ranks by id, so along an axis whose ids do not "
                "increase DTensor would place blocks in rank order, not mesh order. The current lane's torch "
                "(2.15, pip install 'xla-spmd[current]') orders them as the mesh does. On this torch, transpose "
                "the mesh instead of permuting it, e.g. np.arange(n).reshape(b, a).T for an (a, b) mesh whose "
                "first axis is the inner one."
            )
        _align_timeouts(built)
        mesh.memo[key] = built
        _release_at_exit(mesh)
    return mesh.memo[key]


def _align_timeouts(built: Any) -> None:
    """Give every axis group of ``built`` the world group's collective timeout: torch gives a
    new group 30 minutes whatever ``init_process_group`` was told (`torch_compat`), so a hung
    collective on one axis of a 2-D mesh would wait that long."""
    world = torch_compat.group_timeout(_dist().group.WORLD)
    if world is None:
        return
    for dim in range(built.ndim):
        group = built.get_group(dim)
        if torch_compat.group_timeout(group) != world:
            torch_compat.set_group_timeout(group, world)


# How long the exit hook leaves the GIL to gloo's workers: 0.1 s was enough in every measured exit,
# with the two cores busy; a process pays it once, at exit.
_WORKER_DRAIN_SECONDS = 0.1

# The meshes holding a DeviceMesh in their memo, for the exit hook below; weak, so it keeps none.
_holders: weakref.WeakSet = weakref.WeakSet()


def _release_at_exit(mesh: Any) -> None:
    if not _holders:
        atexit.register(_release_device_meshes)
    _holders.add(mesh)


def _release_device_meshes() -> None:
    """Let gloo's workers finish with their last collectives, then drop the DeviceMeshes our
    meshes hold, while the interpreter is still whole.

    A gloo worker that drops a finished collective decrements the Python objects of its tensors,
    which needs the GIL (torch 2.15). A script that ends right after a collective, or holds the
    GIL from there to its end, leaves a worker waiting for the GIL when Python finalizes, and a
    thread that takes the GIL then ends inside a noexcept frame: "terminate called without an
    active exception", SIGABRT (6 of 10 exits of a 10-line gloo script; the abort's stack is
    ``AsyncWork::~AsyncWork`` -> ``decref_pyobject`` -> ``take_gil`` -> ``pthread_exit``).
    Sleeping here gives the waiting workers the GIL: 0 of 32 exits aborted, 16 of them with
    three other busy processes on the two cores.

    A DeviceMesh also keeps its process groups alive, and so their workers, even after
    ``dist.destroy_process_group()`` (pytorch/pytorch#190489); released here, a destroyed group
    is freed now, and its destructor joins the workers.
    """
    time.sleep(_WORKER_DRAIN_SECONDS)
    for mesh in list(_holders):
        for key in [k for k in mesh.memo if k[0] == "device_mesh"]:
            del mesh.memo[key]
    _holders.clear()
    gc.collect()
