"""Replica groups as HLO text writes them (pure Python): the explicit list ``{{0,1},{2,3}}``,
XLA's iota form ``[2,4]<=[4,2]T(1,0)`` and the named-axis form of newer XLA (Shardy's meshes)
``mesh['axis_0'=4,'axis_1'=2] {'axis_1'}``, each read into the device ids of every group."""

from __future__ import annotations

import math
import re

import numpy as np

from spmd.sharding import iota_device_ids

__all__ = ["mesh_axes_groups", "parse_replica_groups"]


def parse_replica_groups(text: str | None, num_devices: int) -> tuple[tuple[int, ...], ...]:
    """Replica groups from HLO text: ``{{0,1},{2,3}}``, iota ``[2,2]<=[4]`` or
    ``[2,4]<=[4,2]T(1,0)``, or the named-axis form of newer XLA (Shardy's meshes)
    ``mesh['axis_0'=4,'axis_1'=2] {'axis_1'}`` (`mesh_axes_groups`); ``{}`` or nothing means one
    group of all devices."""
    if text is None or text.strip() in ("", "{}"):
        return (tuple(range(num_devices)),)
    t = text.strip()
    if t.startswith("mesh["):
        return mesh_axes_groups(t)
    m = re.fullmatch(r"\[([0-9,]+)\](<=.*)", t)
    if m:
        out_shape = [int(d) for d in m.group(1).split(",")]
        ids = iota_device_ids(m.group(2), math.prod(out_shape)).reshape(out_shape)
        return tuple(tuple(int(x) for x in row) for row in ids.reshape(out_shape[0], -1))
    groups = re.findall(r"\{([0-9,\s]*)\}", t)
    parsed = tuple(tuple(int(x) for x in g.split(",") if x.strip()) for g in groups)
    if not parsed:
        raise ValueError(f"Cannot read replica groups {text!r}.")
    return parsed


_MESH_GROUPS = re.compile(
    r"mesh\[(?P<axes>[^\]]*)\](?:,?\s*device_ids=\((?P<ids>[^)]*(?:\([^)]*\))?)\))?\s*\{(?P<refs>[^}]*)\}"
)
_AXIS_REF = re.compile(r"'?(?P<name>[^':(]+)'?(?::\((?P<pre>\d+)\)(?P<size>\d+))?")


def _mesh_device_ids(text: str | None, sizes: list[int], where: str) -> np.ndarray:
    """The mesh's device array: iota when not printed, else XLA's ``[4,2]<=[8]``-style iota or a list."""
    count = math.prod(sizes)
    if text is None:
        return np.arange(count).reshape(sizes)
    m = re.fullmatch(r"\[[0-9,]+\](<=.*)", text.strip())
    if m:
        return iota_device_ids(m.group(1), count, where).reshape(sizes)
    ids = [int(x) for x in re.findall(r"\d+", text.split("]", 1)[-1] if "devices=" in text else text)]
    if len(ids) != count:
        raise ValueError(f"Cannot read the device ids of {where}: {len(ids)} ids for a mesh of {count}.")
    return np.asarray(ids).reshape(sizes)


def mesh_axes_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """Replica groups of XLA's named-axis form: devices that differ only along the listed axes
    (or sub-axes ``'a':(pre)size``, the ``size`` devices of axis ``a`` at stride ``pre``) form a
    group, as XLA's ``MeshAxesReplicaGroupList`` computes them.

    Raises:
        ValueError: the text is not of that form.
    """
    m = _MESH_GROUPS.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"Cannot read replica groups {text!r}: expected mesh[name=size,...] {{axes}}.")
    axes = [a.strip().rsplit("=", 1) for a in m.group("axes").split(",")]
    names = [a[0].strip().strip("'\"") for a in axes]
    sizes = [int(a[1]) for a in axes]
    devices = _mesh_device_ids(m.group("ids"), sizes, repr(text))
    refs = []  # (axis index, pre, size)
    for ref in filter(None, (r.strip() for r in m.group("refs").split(","))):
        r = _AXIS_REF.fullmatch(ref)
        if r is None or r.group("name") not in names:
            raise ValueError(f"Cannot read replica groups {text!r}: axis {ref!r} is not one of {names}.")
        axis = names.index(r.group("name"))
        refs.append((axis, int(r.group("pre") or 1), int(r.group("size") or sizes[axis])))
    # Split each axis into [pre, size, rest] pieces around its referenced sub-axes (majormost first).
    dims: list[int] = []
    grouped: dict[int, int] = {}  # index into refs -> index into dims
    for axis, full in enumerate(sizes):
        mine = sorted((pre, k) for k, (a, pre, _) in enumerate(refs) if a == axis)
        covered = 1
        for pre, k in mine:
            if pre > covered:
                dims.append(pre // covered)
                covered = pre
            grouped[k] = len(dims)
            dims.append(refs[k][2])
            covered *= refs[k][2]
        if covered < full or not mine:
            dims.append(full // covered)
    order = [grouped[k] for k in range(len(refs))]
    kept = [d for d in range(len(dims)) if d not in order]
    size = math.prod(refs[k][2] for k in range(len(refs)))
    ids = devices.reshape(dims).transpose(kept + order).reshape(-1, size)
    return tuple(tuple(int(x) for x in row) for row in ids)
