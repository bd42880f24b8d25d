"""FSDP on the dtensor backend: our units, wrap policies and deferred init, applied with torch's
``fully_shard`` (FSDP2) over the FSDP axes of the mesh's ``DeviceMesh``: one axis, several
flattened into one, and for HSDP a replicate dim before them (`fsdp_xla._dtensor_mesh`).

Units are the same as on GSPMD (`plan_units`: the policy's modules, tied weights in the unit
that holds every use). They are sharded inner first, as ``fully_shard`` requires; with deferred
init each unit is sharded while still on the meta device and each rank then initializes only its
shards, with the values GSPMD's whole-unit init gives (the same per-module seeds;
`fsdp_xla._shard_init`), so the weights equal the GSPMD backend's for the same ``init_seed`` and
no rank holds a unit's unsharded parameters. An init that cannot be replayed on shards (see
there) falls back to allocating that unit whole on the host first.

The GSPMD options map as far as FSDP2 can express them, and are checked before anything is
sharded:

- tensor parallelism: torch's ``parallelize_module`` applied before FSDP (torchtitan's order)
  leaves DTensor parameters over the mesh's ``tensor`` axis; ``fully_shard`` shards them further
  over the FSDP axes (FSDP2's 2-D layout, with deferred init too). `check_tensor_parallel`
  refuses, before anything is sharded, what FSDP2 cannot join: DTensors over an axis FSDP
  shards or replicates over, or over a DeviceMesh not cut from the one of FSDP's mesh.
- ``gradient_checkpointing``: torch's composable ``checkpoint`` on each non-root unit, applied
  before ``fully_shard`` (the order torchtitan uses); the module tree and its state_dict keys
  stay as they are.
- ``param_spec_fn``: a spec with the FSDP axes on one dim (as one entry, in mesh order) becomes
  ``Shard(dim)`` through ``fully_shard``'s ``shard_placement_fn``. FSDP2 shards every parameter
  over its one (flattened) shard dim, so a spec naming other mesh axes (tensor parallelism is
  torch's ``parallelize_module`` on DTensor; a replicate axis holds copies), naming only some of
  the FSDP axes or spreading them over several dims, a replicated spec, and an uneven split of a
  dim other than 0 (FSDP2 pads dim 0 only) raise `FSDPError`.
- ``shard_output``: each rank's inputs are its part of the batch, so each rank's output is its
  part too: already the layout ``P(axes)`` names, ``axes`` the replicate and shard axes in mesh
  order (``P('fsdp')`` with one axis), and that spec is accepted as is. Other layouts, and
  functions (written for GSPMD, they would treat a rank's part as the whole output), raise
  `FSDPError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fsdp_xla._axes import axis_entry, total_size
from fsdp_xla._dtensor_mesh import check_fsdp_mesh, fsdp_device_mesh
from fsdp_xla._options import FSDPOptions
from fsdp_xla._shard_init import init_unit_into_shards, record_unit_init
from fsdp_xla._sharding import spec_from_fn
from fsdp_xla._units import UnitPlan, plan_units
from fsdp_xla.deferred import check_materializable, materialize_unit, needs_materialization
from fsdp_xla.errors import FSDPError
from fsdp_xla.policies import MixedPrecision
from mesh import Mesh, Role
from spmd.backend import DTensorBackend, device_type_of, mesh_text
from spmd.backend import dtensor_device_mesh as device_mesh
from spmd.sharding import PartitionSpec, resolve_spec

__all__ = [
    "DTensorFSDP",
    "check_output_sharding",
    "check_tensor_parallel",
    "fsdp_shard_dims",
    "fully_shard_on_dtensor",
]


def check_output_sharding(
    shard_output: PartitionSpec | Callable[[Any, Mesh], Any] | None, options: FSDPOptions
) -> None:
    """Accept ``shard_output`` where the dtensor backend's outputs already have its layout: the
    batch (dim 0) split over the data-parallel axes (replicate and shard axes, in mesh order).

    Raises:
        FSDPError: a function, or another spec.
    """
    if shard_output is None:
        return
    axes = options.data_parallel_axes
    batch_only = PartitionSpec(axis_entry(axes))
    if not isinstance(shard_output, PartitionSpec):
        raise FSDPError(
            f"shard_output={shard_output!r}: on the dtensor backend each rank's output is its own part of the batch "
            "(a plain tensor), and a function written for GSPMD (mark_sharding on the output) would take it for "
            f"the whole output. Leave shard_output out, or pass {batch_only!r}, the layout the outputs already have."
        )
    entries = list(shard_output)
    while entries and entries[-1] is None:
        entries.pop()
    if entries not in ([axis_entry(axes)], [axes]):
        raise FSDPError(
            f"shard_output={shard_output!r}: on the dtensor backend each rank computes its own part of the batch, so "
            f"the outputs are split on dim 0 over {axis_entry(axes)!r} ({batch_only!r}) and nothing else; another "
            "layout would need the outputs as DTensors, which the loss and the labels are not. Pass "
            f"{batch_only!r} or leave shard_output out."
        )


def check_tensor_parallel(module: torch.nn.Module, options: FSDPOptions) -> None:
    """Accept parameters already laid out (tensor parallelism) where ``fully_shard`` can shard
    them further: DTensors over axes of FSDP's mesh that FSDP neither shards nor replicates over,
    on a DeviceMesh cut from the one of that mesh (FSDP2 joins the two into one,
    ``DeviceMesh._concatenate``, which needs one root and no shared dims; torch's own errors say
    neither which parameter nor the fix).

    Raises:
        FSDPError: a DTensor parameter over an FSDP axis, or over another DeviceMesh.
    """
    from torch.distributed.tensor import DTensor

    mesh, tensor = options.mesh, Role.TENSOR.value
    fsdp_axes = options.data_parallel_axes
    for name, p in module.named_parameters():
        if not isinstance(p, DTensor):
            continue
        axes = tuple(p.device_mesh.mesh_dim_names or ())
        where = f"Parameter {name!r} is a DTensor over mesh axes {axes} (tensor parallelism, laid out before FSDP)"
        clash = [a for a in axes if a in fsdp_axes]
        if clash:
            raise FSDPError(
                f"{where}, and FSDP shards or replicates it over {clash[0]!r} too (fsdp_axis="
                f"{options.fsdp_axis!r}, replicate_axis={options.replicate_axis!r}): an axis splits a weight one "
                f"way. Give tensor parallelism an axis of its own ({tensor!r}: mesh.ParallelDims(..., tensor=n)) "
                "and parallelize over it; FSDP's default axes leave it out."
            )
        ours = device_mesh(mesh, p.device_mesh.device_type)
        if not axes or not set(axes) <= set(mesh.axis_names or ()) or p.device_mesh != ours[axes]:
            raise FSDPError(
                f"{where}, on a DeviceMesh that is not cut from FSDP's mesh {mesh.describe()}: FSDP2 joins the two "
                "into one, which needs them cut from one DeviceMesh. Parallelize over spmd.device_mesh(mesh)"
                f"[{tensor!r}], of the mesh object FSDP is given."
            )


def fsdp_shard_dims(plans: list[UnitPlan], options: FSDPOptions) -> dict[str, int]:
    """``{parameter name: the dim FSDP2 shards it on}`` from ``options.param_spec_fn`` (empty
    without one: FSDP2's default, dim 0). Every spec is checked here, before anything is sharded.

    Raises:
        FSDPError: a spec FSDP2 cannot store (see the module docstring).
        ShardingError: a spec that does not fit its parameter or the mesh.
    """
    if options.param_spec_fn is None:
        return {}
    dims: dict[str, int] = {}
    for plan in plans:
        for slot in plan.slots:
            spec = spec_from_fn(options.param_spec_fn, slot.name, slot.param)
            dim = _shard_dim(slot.name, slot.param, spec, options)
            if dim is not None:
                dims[slot.name] = dim
    return dims


def _shard_dim(name: str, p: torch.Tensor, spec: PartitionSpec, options: FSDPOptions) -> int | None:
    """The dim ``spec`` shards ``p`` on over the shard axes; ``None`` for a scalar left whole."""
    mesh, axis = options.mesh, options.fsdp_axis
    shard = tuple(mesh.axis_index(a) for a in options.shard_axes)
    per_dim = resolve_spec(mesh, spec, p.dim(), tuple(p.shape))
    where = f"param_spec_fn gave parameter {name!r} of shape {tuple(p.shape)} the spec {spec!r}"
    others = sorted({str(mesh.axis_label(a)) for axes in per_dim for a in axes if a not in shard})
    if others:
        replicas = [a for a in others if a in options.replicate_axes]
        why = (
            f"{replicas[0]!r} is a replicate axis, over which HSDP keeps whole copies of the shards"
            if replicas
            else "tensor parallelism there is torch's parallelize_module, applied before FSDP (FSDP then shards the "
            "DTensors it leaves over its own axes)"
        )
        raise FSDPError(
            f"{where}, which names mesh axes {others} besides {axis!r}. On the dtensor backend FSDP is torch's "
            f"fully_shard, which shards each parameter over {axis!r} alone; {why}. Give specs with only "
            f"{axis!r} (e.g. P(None, {axis!r})) there."
        )
    sharded = [d for d, axes in enumerate(per_dim) if axes]
    if not sharded:
        if p.dim() == 0:
            return None  # a scalar: FSDP2 stores it as it stores every scalar
        raise FSDPError(
            f"{where}, which replicates it; FSDP2 (fully_shard) shards every parameter of a unit. Put {axis!r} on "
            "one of its dims."
        )
    if len(sharded) > 1 or per_dim[sharded[0]] != shard:
        raise FSDPError(
            f"{where}: FSDP2 shards a parameter over {axis!r} as one dim of one flattened mesh, in mesh order, so "
            f"a spec must name exactly {axis!r}, on one dim (e.g. P(None, {axis!r}))."
        )
    (dim,) = sharded
    size = total_size(mesh, options.shard_axes)
    if dim > 0 and p.shape[dim] % size:
        raise FSDPError(
            f"{where}: dim {dim} ({p.shape[dim]}) does not divide by the {size} devices of {axis!r}, and FSDP2 "
            "splits a dim other than 0 only evenly (GSPMD pads). Shard a dim that divides, or dim 0."
        )
    return dim


def fully_shard_on_dtensor(
    module: torch.nn.Module,
    plans: list[UnitPlan],
    shard_dims: dict[str, int],
    *,
    fsdp_mesh: Any,
    precision: MixedPrecision | None,
    reshard_after_forward: bool,
    gradient_checkpointing: bool,
    param_init_fn: Callable[[torch.nn.Module], None] | None,
    init_seed: int,
    device_type: str,
) -> torch.nn.Module:
    """Shard ``module`` in place with ``fully_shard`` per unit of ``plans`` (from `plan_units`);
    returns it (an ``FSDPModule``). ``shard_dims`` from `fsdp_shard_dims`; ``fsdp_mesh`` from
    `fsdp_xla._dtensor_mesh.fsdp_device_mesh`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard

    from spmd.torch_compat import composable_checkpoint as checkpoint

    policy_mp = MixedPrecisionPolicy()
    if precision is not None:
        policy_mp = MixedPrecisionPolicy(
            param_dtype=precision.param_dtype,
            reduce_dtype=precision.effective_reduce_dtype,
            cast_forward_inputs=precision.cast_forward_inputs,
        )
    deferred = needs_materialization(module)
    unit_paths = [p.path for p in plans]
    for plan in reversed(plans):  # inner units first; the root last takes what is left
        record = record_unit_init(module, plan, unit_paths, param_init_fn, init_seed) if deferred else None
        if deferred and record is None:
            materialize_unit(module, plan, unit_paths, param_init_fn, init_seed)
        # After materialize_unit: the unit's parameters are the ones fully_shard will see.
        placements = {id(s.param): Shard(shard_dims[s.name]) for s in plan.slots if s.name in shard_dims}
        if gradient_checkpointing and plan.path:
            checkpoint(plan.module)
        # The root's parameters are gathered again at once for backward: FSDP2 keeps them
        # (its default for a root, None), one all-gather fewer per step (measured).
        reshard = reshard_after_forward if plan.path or not reshard_after_forward else None
        fully_shard(
            plan.module,
            mesh=fsdp_mesh,
            mp_policy=policy_mp,
            reshard_after_forward=reshard,
            shard_placement_fn=(lambda p, placements=placements: placements.get(id(p))) if placements else None,
        )
        if record is not None:
            init_unit_into_shards(module, plan, unit_paths, record, init_seed, device_type)
    return module


def wrap_fields(module: torch.nn.Module, options: FSDPOptions) -> dict[str, str]:
    """What every rank must wrap alike, for `FSDP`'s one exchange of its arguments: the model's
    parameters and buffers (names, shapes, dtypes), the mesh, the axes and the sharding options.
    A model that differed on one rank made each rank shard its own shapes, and the first
    all-gather aborted the process (gloo) or mixed other tensors' bytes."""
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return {
        "parameters": ", ".join(f"{n} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for n, t in tensors),
        "mesh": mesh_text(options.mesh),
        "fsdp axes": repr((options.fsdp_axis, options.replicate_axis)),
        "options": repr(
            (options.reshard_after_forward, options.gradient_checkpointing, options.mixed_precision, options.init_seed)
        ),
    }


class DTensorFSDP:
    """`fsdp_xla._backends.FSDPBackend` on DTensor: torch's ``fully_shard`` per unit."""

    def check(self, module: torch.nn.Module, options: FSDPOptions) -> None:
        """What FSDP2 cannot express (`check_output_sharding`, `fsdp_shard_dims`), deferred
        init's hooks, and the world the mesh needs; all before anything is sharded, after the
        ranks agreed on what they wrap (`wrap_fields`, in `FSDP`'s one exchange), so every rank
        refuses alike."""
        check_output_sharding(options.shard_output, options)
        check_fsdp_mesh(options)
        check_tensor_parallel(module, options)
        plans = plan_units(module, options.auto_wrap_policy)
        fsdp_shard_dims(plans, options)
        if needs_materialization(module):
            check_materializable(module, plans, options.param_init_fn)
        backend = DTensorBackend()
        options.mesh.check_device_count(backend.device_count(), backend.more_devices)

    def apply(self, module: torch.nn.Module, options: FSDPOptions) -> torch.nn.Module:
        plans = plan_units(module, options.auto_wrap_policy)
        device_type = device_type_of(next(iter(module.parameters())))
        sharded = fully_shard_on_dtensor(
            module,
            plans,
            fsdp_shard_dims(plans, options),
            fsdp_mesh=fsdp_device_mesh(options, device_type),
            precision=options.mixed_precision,
            reshard_after_forward=options.reshard_after_forward,
            gradient_checkpointing=options.gradient_checkpointing,
            param_init_fn=options.param_init_fn,
            init_seed=options.init_seed,
            device_type=device_type,
        )
        if options.replicate_sync is not None:
            _install_all_reduce_hook(sharded, options.replicate_sync.all_reduce_hook())
        return sharded


def _install_all_reduce_hook(module: torch.nn.Module, hook: Callable[[torch.Tensor], None]) -> None:
    """Every unit's reduce-scattered gradient shard goes through ``hook`` (the replicas'
    all-reduce, `fsdp_xla._replicas`): FSDP2 calls it per unit, in the unit's own backward."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_all_reduce_hook(hook)
