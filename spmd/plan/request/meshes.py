"""The plan's mesh: its axes, its default shape, and its devices on the TPU topology.

Four axes: ``data`` (the batch only; across slices, over DCN), ``fsdp`` (the batch and the
parameters), ``context`` (the sequence, and the parameters with ``fsdp``: context parallelism,
`spmd.plan.request.context`) and ``tensor`` (the 2-D plan's heads, MLP and vocabulary). A mesh position is a
JAX device: a chip, or a TensorCore on TPU7x (`spmd.plan.request.topology`). Devices come from libtpu's
compile-only client and are laid out in the installed jax's ICI-aware order (`create_device_mesh`,
or `create_hybrid_device_mesh` across slices, the order our `HybridMesh` follows), which differs
between jax versions on TPU7x (`spmd.plan._jax_compat`); the report names it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mesh import Mesh, Role, roles
from spmd.plan._jax_compat import device_mesh, topology_devices
from spmd.plan.errors import PlanError
from spmd.plan.request.dcn import split_dcn
from spmd.plan.request.topology import TpuSlice

__all__ = [
    "ADVISED_STRATEGIES",
    "MESH_AXES",
    "STRATEGIES",
    "auto_mesh_shape",
    "batch_axes",
    "build_mesh",
    "check_mesh",
    "tpu_devices",
]

# fsdp: every parameter on the fsdp axis (and context's, when the mesh has one); cp: the same, with
# the context axis required; 2d: fsdp x tensor; dp: replicated
STRATEGIES = (Role.FSDP.value, "2d", "dp", "cp")
ADVISED_STRATEGIES = STRATEGIES[:3]  # what the advisor tries unless told: cp needs flash attention
MESH_AXES = (Role.DATA.value, Role.FSDP.value, Role.CONTEXT.value, Role.TENSOR.value)
_NEEDS = {
    Role.FSDP.value: (Role.FSDP.value,), "2d": (Role.FSDP.value, Role.TENSOR.value), "dp": (),
    "cp": (Role.FSDP.value, Role.CONTEXT.value),
}  # fmt: skip


def tpu_devices(target: TpuSlice) -> list[Any]:
    """The target's devices from libtpu's compiler (no TPU needed).

    Raises:
        CompilerVersionError: the installed libtpu does not know the chip (tpu7x on the torch_xla lane).
        TopologyError: libtpu refuses the shape.
    """
    return topology_devices(target.libtpu_topology, target.slices, target.chip.name)


def auto_mesh_shape(strategy: str, target: TpuSlice, tensor: int = 4) -> dict[str, int]:
    """The default mesh: ``data`` over slices (DCN) when there are several, then ``fsdp`` over
    each slice's devices; 2-D splits ``tensor`` (default 4, as PyTorch/XLA's Llama 2 70B runs) off
    ``fsdp``; data parallel is one ``data`` axis over every device."""
    per_slice = target.devices_per_slice
    data = {Role.DATA.value: target.slices} if target.slices > 1 else {}
    if strategy == "dp":
        return {Role.DATA.value: target.devices}
    if strategy == "cp":
        raise PlanError(
            f"Strategy 'cp' splits the sequence over a context axis whose size the planner does not guess: give "
            f"the mesh, e.g. mesh={{'fsdp': {max(per_slice // 8, 1)}, 'context': 8}} (--mesh fsdp=N,context=C)."
        )
    if strategy == "2d":
        if per_slice % tensor:
            raise PlanError(f"tensor={tensor} does not divide the {per_slice} devices of a {target.name} slice.")
        return {**data, Role.FSDP.value: per_slice // tensor, Role.TENSOR.value: tensor}
    return {**data, Role.FSDP.value: per_slice}


def batch_axes(shape: Mapping[str, int]) -> tuple[str, ...]:
    """The axes the batch splits over (`mesh.roles.batch_axes`: ``data`` and ``fsdp``)."""
    return roles.batch_axes(tuple(shape))


def check_mesh(shape: Mapping[str, int], strategy: str, target: TpuSlice) -> None:
    """Raise `PlanError` unless ``shape`` names the planner's axes, those ``strategy`` needs,
    with positive sizes multiplying to the target's devices."""
    unknown = [a for a in shape if a not in MESH_AXES]
    if unknown:
        raise PlanError(
            f"Mesh {dict(shape)} has axes {unknown}; the planner's axes are {MESH_AXES} (data: batch only, fsdp: "
            "batch and parameters, context: the sequence (and parameters), tensor: the 2-D plan's heads/mlp/vocab). "
            "Rename the axes."
        )
    needs = _NEEDS[strategy]
    if Role.CONTEXT.value in shape and strategy not in (Role.FSDP.value, "cp"):
        raise PlanError(
            f"Mesh {dict(shape)} has a context axis, which the planner plans with strategy 'fsdp' or 'cp' (the "
            f"sequence over context, parameters over fsdp x context), not {strategy!r}. Use --strategy cp, or drop "
            "the context axis."
        )
    missing = [a for a in needs if a not in shape]
    if missing or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in shape.values()):
        raise PlanError(
            f"Strategy {strategy!r} needs mesh axes {needs} with positive integer sizes; got mesh {dict(shape)}."
        )
    if math.prod(shape.values()) != target.devices:
        per_chip = f" ({target.chip.devices_per_chip} per chip)" if target.chip.devices_per_chip > 1 else ""
        raise PlanError(
            f"Mesh {dict(shape)} has {math.prod(shape.values())} devices; {target.name} x {target.slices} slice(s) has "
            f"{target.devices} devices{per_chip}. Make the axis sizes multiply to {target.devices}."
        )


def build_mesh(
    shape: Mapping[str, int], target: TpuSlice, devices: list[Any], dcn: Mapping[str, int] | None = None
) -> Mesh:
    """Our `Mesh` over ``devices`` positions, in the physical order the installed jax gives
    (`spmd.plan._jax_compat.device_mesh`, its hybrid mesh across slices). ``dcn``: the slices each axis
    spans (`spmd.plan.request.dcn.split_dcn`); default a ``data`` axis spanning them all."""
    names, sizes = tuple(shape), tuple(shape.values())
    if math.prod(sizes) != len(devices):
        raise PlanError(
            f"Mesh {dict(shape)} has {math.prod(sizes)} devices; {target.name} x {target.slices} slice(s) has "
            f"{len(devices)}. Make the axis sizes multiply to {len(devices)}."
        )
    if target.slices > 1:
        spans = dict(dcn) if dcn else split_dcn(shape, target.slices)[1]
        across = tuple(spans.get(n, 1) for n in names)
        if math.prod(across) != target.slices or any(s % d for s, d in zip(sizes, across, strict=True)):
            raise PlanError(
                f"Mesh {dict(shape)} cannot span {target.slices} slices as {spans}: the DCN sizes must multiply to "
                "the slices and divide their axes."
            )
        ici = tuple(s // d for s, d in zip(sizes, across, strict=True))
        ordered = device_mesh(ici, devices, across)
    else:
        ordered = device_mesh(sizes, devices)
    position = {d.id: k for k, d in enumerate(devices)}
    ids = np.vectorize(lambda d: position[d.id])(ordered)
    return Mesh(ids.reshape(-1), sizes, names)
