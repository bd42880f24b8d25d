"""The DeviceMesh torch's ``fully_shard`` (FSDP2) gets on the dtensor backend, and what it needs
of our mesh.

FSDP2 takes a 1-D mesh (shard) or, for HSDP, a 2-D one (replicate, shard). Our options name
several shard axes, and possibly several replicate axes; each group becomes one dim of that mesh:
the axis itself, or the axes flattened into one (`spmd._util.torch_compat.flatten_device_mesh`,
torch's private ``DeviceMesh._flatten``), as torchtitan flattens ``dp_shard x cp``. The replicate
dim stays a mesh dim of its own, so what replicates the shards can later be swapped (torchft's
healing HSDP) without touching the shard dim.

Two layouts torch cannot build are refused here before anything is sharded:

- a replicate axis after a shard axis in the mesh: FSDP2's HSDP mesh is (replicate, shard) and
  torch slices a DeviceMesh only in mesh order (``KeyError``, torch 2.9 and 2.15);
- axes flattened where the ids, read in mesh order, do not increase: the flattened process group
  orders its ranks by id (measured on torch 2.9 and 2.15: on ids ``[[0, 2], [1, 3]]`` the group is
  ``[0, 1, 2, 3]`` while the flattened mesh reads ``[0, 2, 1, 3]``), so rank 1 would hold the block
  the mesh gives rank 2, and a checkpoint would record it there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fsdp_xla._options import FSDPOptions
from fsdp_xla.errors import FSDPError
from mesh import Mesh
from spmd import torch_compat
from spmd.backend import dtensor_device_mesh as device_mesh

__all__ = ["check_fsdp_mesh", "fsdp_device_mesh"]


def check_fsdp_mesh(options: FSDPOptions) -> None:
    """Refuse, before anything is sharded, a layout of the shard and replicate axes that torch
    cannot build as FSDP2's mesh (see the module docstring).

    Raises:
        FSDPError: a replicate axis after a shard axis, or axes to flatten whose ids do not
            increase in mesh order.
    """
    mesh = options.mesh
    names = tuple(mesh.axis_names or ())
    replicate, shard = options.replicate_axes, options.shard_axes
    if replicate and max(names.index(a) for a in replicate) > min(names.index(a) for a in shard):
        order = tuple(dict.fromkeys((*replicate, *shard, *names)))
        raise FSDPError(
            f"HSDP on the dtensor backend: {mesh.describe()} puts replicate axis(es) {replicate} after shard "
            f"axis(es) {shard}. torch's fully_shard takes HSDP's mesh as (replicate, shard), and torch slices a "
            f"DeviceMesh only in mesh order. Order the mesh's axes {order} (ParallelDims(...).mesh() puts the "
            "replicate axis first), or pass replicate_axis=()."
        )
    for option, axes in (("fsdp_axis", shard), ("replicate_axis", replicate)):
        if len(axes) > 1:
            _check_flattens_in_mesh_order(mesh, axes, option)


def _check_flattens_in_mesh_order(mesh: Mesh, axes: tuple[str, ...], option: str) -> None:
    names = tuple(mesh.axis_names or ())
    ids = mesh.get_logical_mesh()
    picked = [names.index(a) for a in axes]
    rest = [i for i in range(ids.ndim) if i not in picked]
    groups = np.transpose(ids, rest + picked).reshape(-1, int(np.prod([ids.shape[i] for i in picked])))
    for group in groups:
        if (np.diff(group) <= 0).any():
            raise FSDPError(
                f"FSDP on the dtensor backend flattens {option} axes {axes} of {mesh.describe()} into one process "
                f"group, and torch orders that group by rank (DeviceMesh._flatten, torch 2.9 and 2.15), but the "
                f"ids along them in mesh order are {group.tolist()}: the ranks would hold other ranks' blocks. "
                f"Number the devices in mesh order (np.arange(n).reshape(shape)), or name one axis in {option}."
            )


def fsdp_device_mesh(options: FSDPOptions, device_type: str) -> Any:
    """The DeviceMesh to give ``fully_shard``: 1-D over the shard axes, or 2-D (replicate, shard)
    for HSDP. Collective the first time a mesh or flattening is built (every rank calls it, in
    the same order)."""
    full = device_mesh(options.mesh, device_type)
    if not options.replicate_axes:
        return torch_compat.flatten_device_mesh(full, options.shard_axes)
    return torch_compat.replicate_shard_mesh(full, options.replicate_axes, options.shard_axes)
