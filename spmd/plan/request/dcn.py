"""How the mesh's axes span slices over DCN, in MaxText's terms (``dcn_*_parallelism``).

A multi-slice mesh is ICI axes within each slice times DCN axes across slices (MaxText's
``ici_fsdp_parallelism`` x ``dcn_fsdp_parallelism``, jax's ``create_hybrid_device_mesh``). The
planner's mesh gives each axis's whole size and, for the axes that cross slices, how many slices
they span: ``--mesh dcn_fsdp=2,fsdp=64,tensor=4`` on 2 slices is ``fsdp`` 128 (64 within a
slice x 2 slices: parameters sharded over DCN too, each device holding 1/128 of them) by
``tensor`` 4; ``dcn_data=2,fsdp=256`` is data parallelism across the slices (what a mesh with
no ``dcn_`` axis means with ``--slices``: a ``data`` axis whose size includes the slices).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from mesh import Role
from spmd.plan.errors import PlanError

__all__ = ["DCN_PREFIX", "split_dcn", "whole_sizes"]

DCN_PREFIX = "dcn_"


def whole_sizes(mesh: Mapping[str, int]) -> dict[str, int]:
    """Each axis's whole size (its ``dcn_`` size times its size within a slice), unchecked: a
    mesh `split_dcn` accepted, read back (the advisor's candidates keep the ``dcn_`` form)."""
    shape: dict[str, int] = {}
    for key in mesh:
        axis = key[len(DCN_PREFIX) :] if key.startswith(DCN_PREFIX) else key
        if axis not in shape:
            shape[axis] = mesh.get(axis, 1) * mesh.get(DCN_PREFIX + axis, 1)
    return shape


def split_dcn(mesh: Mapping[str, int], slices: int) -> tuple[dict[str, int], dict[str, int]]:
    """``(shape, dcn)``: each axis's whole size, and the slices each axis spans (only axes that
    span more than one).

    ``mesh`` names ICI sizes and ``dcn_<axis>`` DCN sizes (MaxText's ``ici_*`` and ``dcn_*``
    parallelism); an axis named only as ``dcn_<axis>`` is 1 within a slice. A mesh with no
    ``dcn_`` entry is the planner's older form: whole sizes, a ``data`` axis spanning every slice.

    Raises:
        PlanError: a ``dcn_`` entry of no mesh axis, DCN sizes whose product is not ``slices``, or
            (no ``dcn_`` entry) several slices and no ``data`` axis they divide.
    """
    dcn = {k[len(DCN_PREFIX) :]: v for k, v in mesh.items() if k.startswith(DCN_PREFIX)}
    if not dcn:
        shape = dict(mesh)
        data = Role.DATA.value
        if slices > 1 and (data not in shape or shape[data] % slices):
            raise PlanError(
                f"With {slices} slices the mesh needs a 'data' axis divisible by {slices} (data parallelism over DCN), "
                f"or names how axes span the slices, MaxText's way: dcn_data={slices} or dcn_fsdp={slices} "
                f"(e.g. --mesh dcn_fsdp={slices},fsdp=64,tensor=4); got {dict(mesh)}."
            )
        return shape, ({data: slices} if slices > 1 else {})
    axes = tuple(r.value for r in Role)
    unknown = [a for a in dcn if a not in axes]
    if unknown:
        raise PlanError(
            f"Mesh {dict(mesh)} names DCN sizes of {[DCN_PREFIX + a for a in unknown]}; the axes that can span slices "
            f"are {[DCN_PREFIX + a for a in axes]}."
        )
    if math.prod(dcn.values()) != slices:
        raise PlanError(
            f"Mesh {dict(mesh)}: the DCN sizes {dcn} multiply to {math.prod(dcn.values())}, and the slice count is "
            f"{slices} (--slices); make them multiply to {slices}."
        )
    return whole_sizes(mesh), {a: s for a, s in dcn.items() if s > 1}
