"""FSDP on the dtensor backend: our units, wrap policies and deferred init, applied with torch's
``fully_shard`` (FSDP2) over the ``fsdp`` axis of the mesh's ``DeviceMesh``.

Units are the same as on GSPMD (`plan_units`: the policy's modules, tied weights in the unit
that holds every use). They are sharded inner first, as ``fully_shard`` requires; with deferred
init each unit is first allocated on the host and initialized exactly as on GSPMD (the same
per-module seeds), so the weights equal the GSPMD backend's for the same ``init_seed``, and only
one unit exists unsharded at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fsdp_xla._units import plan_units
from fsdp_xla.deferred import materialize_unit, needs_materialization
from fsdp_xla.policies import MixedPrecision, WrapPolicy
from mesh import Mesh
from spmd._backend.dtensor_backend import device_mesh

__all__ = ["fully_shard_on_dtensor"]


def fully_shard_on_dtensor(
    module: torch.nn.Module,
    mesh: Mesh,
    fsdp_axis: str,
    policy: WrapPolicy | None,
    precision: MixedPrecision | None,
    reshard_after_forward: bool,
    param_init_fn: Callable[[torch.nn.Module], None] | None,
    init_seed: int,
    device_type: str,
) -> torch.nn.Module:
    """Shard ``module`` in place with ``fully_shard`` per unit; returns it (an ``FSDPModule``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    full = device_mesh(mesh, device_type)
    fsdp_mesh = full[fsdp_axis] if mesh.ndim > 1 else full
    policy_mp = MixedPrecisionPolicy()
    if precision is not None:
        policy_mp = MixedPrecisionPolicy(
            param_dtype=precision.compute_dtype,
            reduce_dtype=precision.effective_reduce_dtype,
            cast_forward_inputs=precision.cast_inputs,
        )
    plans = plan_units(module, policy)
    deferred = needs_materialization(module)
    unit_paths = [p.path for p in plans]
    for plan in reversed(plans):  # inner units first; the root last takes what is left
        if deferred:
            materialize_unit(module, plan, unit_paths, param_init_fn, init_seed)
        # The root's parameters are gathered again at once for backward: FSDP2 keeps them
        # (its default for a root, None), one all-gather fewer per step (measured).
        reshard = reshard_after_forward if plan.path or not reshard_after_forward else None
        fully_shard(plan.module, mesh=fsdp_mesh, mp_policy=policy_mp, reshard_after_forward=reshard)
    return module
