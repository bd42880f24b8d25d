"""FSDP on GSPMD (the torch_xla backend): each unit's parameters stored sharded on the FSDP axis
(annotations on the device tensors), gathered for its forward and again for its backward by
`fsdp_xla._gspmd_unit`; `fully_shard` then swaps each unit's class for an FSDP subclass
(`fsdp_xla._module`).

Several FSDP axes are one entry of the stored spec (``P(('fsdp', 'context'), None)``) and the
gathered layout drops them all. HSDP needs nothing more here: a spec that does not name the
replicate axis is replicated over it, and GSPMD reduces each gradient over every axis the batch
was split on (the batch split over ``('data', 'fsdp')`` gives a gradient partial over both,
reduced to the shard layout, which is whole on each replica)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fsdp_xla._axes import total_size
from fsdp_xla._gspmd_unit import GspmdUnit, Registry, UnitConfig
from fsdp_xla._options import FSDPOptions
from fsdp_xla._sharding import default_fsdp_spec, spec_from_fn, without_axis
from fsdp_xla._units import UnitPlan, plan_units
from fsdp_xla.deferred import check_materializable, materialize_unit, needs_materialization
from fsdp_xla.errors import FaultToleranceError, FSDPError
from fsdp_xla.policies import MixedPrecision
from mesh import Mesh
from spmd import PartitionSpec, mark_sharding, use_shardable_layer_norm
from spmd.backend import torch_xla_backend
from spmd.errors import ShardingError
from spmd.sharding import HloSharding, hlo_sharding_for

__all__ = ["GspmdFSDP"]


class GspmdFSDP:
    """`fsdp_xla._backends.FSDPBackend` on torch_xla's GSPMD."""

    def check(self, module: torch.nn.Module, options: FSDPOptions) -> None:
        """Everything GSPMD's FSDP accepts (every parameter's layout, deferred init's hooks); the
        runtime in SPMD mode over the mesh's devices. Nothing is changed before this passes."""
        _refuse_replica_sync(options)
        torch_xla_backend.ensure_spmd()
        options.mesh.check_device_count(
            torch_xla_backend.device_count(), torch_xla_backend.TorchXlaBackend.more_devices
        )
        plans = plan_units(module, options.auto_wrap_policy)
        _layouts(plans, options)
        if needs_materialization(module):
            check_materializable(module, plans, options.param_init_fn)

    def apply(self, module: torch.nn.Module, options: FSDPOptions) -> torch.nn.Module:
        """Shard ``module`` unit by unit (materializing deferred ones) and make each an FSDP unit."""
        plans = plan_units(module, options.auto_wrap_policy)
        layouts = _layouts(plans, options)  # may refuse: before the first change
        if options.shardable_layer_norm:
            use_shardable_layer_norm(module)
        registry = Registry(
            torch_xla_backend.platform() == "CPU"
            if options.sync_after_backward is None
            else options.sync_after_backward
        )
        config = _unit_config(options)
        deferred = needs_materialization(module)
        unit_paths = [p.path for p in plans]
        for plan in plans:
            if deferred:
                materialize_unit(module, plan, unit_paths, options.param_init_fn, options.init_seed)
            shardings = _place_parameters(plan, options.mesh, layouts)
            _place_buffers(plan, options.mixed_precision)
            checkpoint = options.gradient_checkpointing and plan.path != ""
            unit = plan.module  # fully_shard then makes it an FSDP unit (fsdp_xla._module.fsdp_class)
            unit.__dict__["_fsdp_unit"] = GspmdUnit(plan, shardings, config, registry, checkpoint)
            unit.__dict__["_fsdp_mesh"] = options.mesh
        module.__dict__["_fsdp_shard_output"] = options.shard_output
        module.__dict__["_fsdp_specs"] = {name: layout.spec for name, layout in layouts.items()}
        return module


def _unit_config(options: FSDPOptions) -> UnitConfig:
    precision = options.mixed_precision
    return UnitConfig(
        compute_dtype=precision.param_dtype if precision else None,
        reduce_dtype=precision.effective_reduce_dtype if precision else None,
        cast_inputs=precision.cast_forward_inputs if precision else False,
        reshard_after_forward=options.reshard_after_forward,
        barriers=options.optimization_barriers,
    )


@dataclass(frozen=True)
class _Layout:
    """Where one parameter is stored (``spec``, ``stored``) and computed (``gathered``)."""

    spec: PartitionSpec
    stored: HloSharding
    gathered: HloSharding


def _layouts(plans: list[UnitPlan], options: FSDPOptions) -> dict[str, _Layout]:
    """Every parameter's layout, by name, each checked against its shape, the mesh and the
    sharding it may already carry: all refusals happen here, before anything is changed."""
    mesh, axis, spec_fn = options.mesh, options.fsdp_axis, options.param_spec_fn
    size = total_size(mesh, options.shard_axes)
    layouts: dict[str, _Layout] = {}
    for slot in (slot for plan in plans for slot in plan.slots):
        p = slot.param
        shape = tuple(p.shape)
        spec = spec_from_fn(spec_fn, slot.name, p) if spec_fn is not None else default_fsdp_spec(shape, axis, size)
        try:
            stored = hlo_sharding_for(mesh, spec, p.dim(), shape)
        except ShardingError as e:  # say which parameter
            raise type(e)(f"FSDP, parameter {slot.name!r}: {e}") from None
        _check_not_on_replicate_axes(slot.name, shape, spec, options)
        existing = torch_xla_backend.sharding_of(p) if torch_xla_backend.is_xla_tensor(p) else None
        if existing is not None and not existing.is_replicated and existing != stored:
            raise FSDPError(
                f"Parameter {slot.name!r} of shape {shape} is already sharded as {existing}; FSDP would store it "
                f"as {spec!r}. Pass param_spec_fn returning the full spec (tensor axes and {axis!r}), or do not "
                "mark it before wrapping."
            )
        layouts[slot.name] = _Layout(spec, stored, hlo_sharding_for(mesh, without_axis(spec, axis), p.dim(), shape))
    return layouts


def _check_not_on_replicate_axes(name: str, shape: tuple[int, ...], spec: PartitionSpec, options: FSDPOptions) -> None:
    """Refuse a ``param_spec_fn`` spec that splits a parameter over a replicate axis: HSDP keeps a
    whole copy of the shards there, and the gathered layout (the spec without the shard axes)
    would stay split over it.

    Raises:
        FSDPError: the spec names a replicate axis.
    """
    named = {a for entry in spec for a in ((entry,) if isinstance(entry, str) else (entry or ()))}
    hit = [a for a in options.replicate_axes if a in named]
    if hit:
        raise FSDPError(
            f"param_spec_fn gave parameter {name!r} of shape {shape} the spec {spec!r}, which splits it over "
            f"{hit[0]!r}, a replicate axis (replicate_axis={options.replicate_axis!r}): HSDP keeps whole copies of "
            f"the shards there. Shard over {options.fsdp_axis!r} only, or make {hit[0]!r} a shard axis: "
            f"fsdp_axis={(*options.shard_axes, hit[0])!r}."
        )


def _place_parameters(plan: UnitPlan, mesh: Mesh, layouts: dict[str, _Layout]) -> list[tuple[HloSharding, HloSharding]]:
    """Store each of the unit's parameters sharded (``layouts`` from `_layouts`); return
    (stored, gathered) shardings."""
    shardings = []
    for slot in plan.slots:
        p = slot.param
        layout = layouts[slot.name]
        if torch_xla_backend.is_xla_tensor(p):
            mark_sharding(p, mesh, layout.spec, replace=True)
            new = p
        else:
            data = p.detach()
            if data.device.type != "cpu":
                data = data.cpu()
            new = torch.nn.Parameter(
                torch_xla_backend.to_device_sharded(data, layout.stored), requires_grad=p.requires_grad
            )
        if new is not p:
            for owner, attr in slot.owners:
                owner._parameters[attr] = new
            slot.param = new
        shardings.append((layout.stored, layout.gathered))
    return shardings


def _place_buffers(plan: UnitPlan, precision: MixedPrecision | None) -> None:
    for _, owner, attr in plan.buffers:
        b = owner._buffers[attr]
        if b is None:
            continue
        if precision is not None and b.is_floating_point():
            b = b.to(precision.effective_buffer_dtype)
        if not torch_xla_backend.is_xla_tensor(b):
            b = torch_xla_backend.to_device_sharded(b.detach().cpu(), HloSharding.replicated())
        owner._buffers[attr] = b


def _refuse_replica_sync(options: FSDPOptions) -> None:
    """Healing HSDP needs each replica group to be a job of its own whose gradients leave the
    step through an eager hook; a GSPMD program is one compiled graph over every device of the
    mesh, with no point where another job's replicas could join or leave."""
    if options.replicate_sync is not None:
        raise FaultToleranceError(
            f"FSDP replicate_axis={options.replicate_sync.describe()}: healing HSDP (torchft) runs on the dtensor "
            "backend only (the current lane: torch 2.11 to 2.15 under torchrun, pip install 'xla-spmd[current,ft]'). "
            "On the torch_xla lane a lost device stops the compiled program: resume from fsdp_xla.checkpoint."
            "save_sharded's checkpoints, and pass replicate_axis as mesh axis names."
        )
