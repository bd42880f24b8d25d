"""FSDP on GSPMD (the torch_xla backend): each unit's parameters stored sharded on the FSDP axis
(annotations on the device tensors), gathered for its forward and again for its backward by
`fsdp_xla._runtime`, the module's class swapped for an FSDP subclass (`fsdp_xla._module`)."""

from __future__ import annotations

import torch

from fsdp_xla._module import fsdp_class
from fsdp_xla._options import FSDPOptions
from fsdp_xla._runtime import Registry, UnitConfig, UnitRuntime
from fsdp_xla._sharding import SpecFn, default_fsdp_spec, spec_from_fn, without_axis
from fsdp_xla._units import UnitPlan, plan_units
from fsdp_xla.deferred import materialize_unit, needs_materialization
from fsdp_xla.errors import FSDPError
from fsdp_xla.policies import MixedPrecision
from mesh import Mesh
from spmd import PartitionSpec, mark_sharding, use_shardable_layer_norm
from spmd._backend import backend
from spmd.errors import ShardingError
from spmd.hlo_sharding import HloSharding
from spmd.named_sharding import hlo_sharding_for

__all__ = ["GspmdEngine"]


class GspmdEngine:
    """`fsdp_xla._engines.FSDPEngine` on torch_xla's GSPMD."""

    def check(self, module: torch.nn.Module, options: FSDPOptions) -> None:
        """Everything GSPMD's FSDP accepts; the runtime in SPMD mode over the mesh's devices."""
        backend.ensure_spmd()
        options.mesh.check_device_count(backend.device_count(), backend.TorchXlaBackend.more_devices)

    def apply(self, module: torch.nn.Module, options: FSDPOptions) -> torch.nn.Module:
        """Shard ``module`` unit by unit (materializing deferred ones) and make each an FSDP unit."""
        if options.shardable_layer_norm:
            use_shardable_layer_norm(module)
        plans = plan_units(module, options.auto_wrap_policy)
        registry = Registry(
            backend.platform() == "CPU" if options.sync_after_backward is None else options.sync_after_backward
        )
        config = _unit_config(options)
        specs: dict[str, PartitionSpec] = {}
        deferred = needs_materialization(module)
        unit_paths = [p.path for p in plans]
        for plan in plans:
            if deferred:
                materialize_unit(module, plan, unit_paths, options.param_init_fn, options.init_seed)
            shardings = _place_parameters(plan, options.mesh, options.fsdp_axis, options.param_spec_fn, specs)
            _place_buffers(plan, options.mixed_precision)
            checkpoint = options.gradient_checkpointing and plan.path != ""
            unit = plan.module
            unit.__class__ = fsdp_class(type(unit))
            unit.__dict__["_fsdp_runtime"] = UnitRuntime(plan, shardings, config, registry, checkpoint)
            unit.__dict__["_fsdp_mesh"] = options.mesh
        module.__dict__["_fsdp_shard_output"] = options.shard_output
        module.__dict__["_fsdp_specs"] = specs
        return module


def _unit_config(options: FSDPOptions) -> UnitConfig:
    precision = options.mixed_precision
    return UnitConfig(
        compute_dtype=precision.compute_dtype if precision else None,
        reduce_dtype=precision.effective_reduce_dtype if precision else None,
        cast_inputs=precision.cast_inputs if precision else False,
        reshard_after_forward=options.reshard_after_forward,
        barriers=options.optimization_barriers,
    )


def _place_parameters(
    plan: UnitPlan,
    mesh: Mesh,
    fsdp_axis: str,
    spec_fn: SpecFn | None,
    specs_out: dict[str, PartitionSpec],
) -> list[tuple[HloSharding, HloSharding]]:
    """Store each of the unit's parameters sharded; return (stored, gathered) shardings."""
    size = mesh.axis_size(fsdp_axis)
    shardings = []
    for slot in plan.slots:
        p = slot.param
        if spec_fn is not None:
            spec = spec_from_fn(spec_fn, slot.name, p)
        else:
            spec = default_fsdp_spec(tuple(p.shape), fsdp_axis, size)
        try:
            stored = hlo_sharding_for(mesh, spec, p.dim(), tuple(p.shape))
        except ShardingError as e:  # say which parameter
            raise type(e)(f"FSDP, parameter {slot.name!r}: {e}") from None
        gathered = hlo_sharding_for(mesh, without_axis(spec, fsdp_axis), p.dim(), tuple(p.shape))
        specs_out[slot.name] = spec
        if backend.is_xla_tensor(p):
            existing = backend.sharding_of(p)
            if existing is not None and not existing.is_replicated and existing != stored:
                raise FSDPError(
                    f"Parameter {slot.name!r} of shape {tuple(p.shape)} is already sharded as {existing}; FSDP "
                    f"would store it as {spec!r}. Pass param_spec_fn returning the full spec (tensor axes and "
                    f"{fsdp_axis!r}), or do not mark it before wrapping."
                )
            mark_sharding(p, mesh, spec, replace=True)
            new = p
        else:
            data = p.detach()
            if data.device.type != "cpu":
                data = data.cpu()
            new = torch.nn.Parameter(backend.to_device_sharded(data, stored), requires_grad=p.requires_grad)
        if new is not p:
            for owner, attr in slot.owners:
                owner._parameters[attr] = new
            slot.param = new
        shardings.append((stored, gathered))
    return shardings


def _place_buffers(plan: UnitPlan, precision: MixedPrecision | None) -> None:
    for _, owner, attr in plan.buffers:
        b = owner._buffers[attr]
        if b is None:
            continue
        if precision is not None and b.is_floating_point():
            b = b.to(precision.effective_buffer_dtype)
        if not backend.is_xla_tensor(b):
            b = backend.to_device_sharded(b.detach().cpu(), HloSharding.replicated())
        owner._buffers[attr] = b
