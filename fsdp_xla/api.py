"""`FullyShardedDataParallel` (alias `FSDP`): FSDP on GSPMD, applied to a module in place.

``FSDP(model, ...)`` returns ``model`` itself, its class (and each unit's) swapped for a
subclass that also derives from `FullyShardedDataParallel`, as PyTorch's FSDP2
``fully_shard`` does. So ``isinstance(model, GPT2LMHeadModel)`` still holds, attributes such
as ``model.config`` still work, and ``state_dict()`` keys are unchanged. Parameters stay the
same ``nn.Parameter`` objects when they were already on the XLA device (they are resharded in
place); parameters on the host or the meta device are replaced by sharded device parameters,
so build the optimizer after wrapping.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from fsdp_xla._dtensor_fsdp import check_output_sharding, fsdp_shard_dims, fully_shard_on_dtensor
from fsdp_xla._runtime import Registry, UnitConfig, UnitRuntime
from fsdp_xla._sharding import SpecFn, default_fsdp_spec, spec_from_fn, without_axis
from fsdp_xla._units import UnitPlan, plan_units
from fsdp_xla.deferred import materialize_unit, needs_materialization
from fsdp_xla.errors import FSDPError, FSDPTypeError, MeshAxisError, WrapPolicyError
from fsdp_xla.policies import MixedPrecision, WrapPolicy
from mesh import Mesh, mesh_or_global
from spmd import PartitionSpec, mark_sharding, use_shardable_layer_norm, with_sharding_constraint
from spmd._backend import backend, backend_for
from spmd._backend.dtensor_backend import device_type_of
from spmd.errors import ShardingError
from spmd.hlo_sharding import HloSharding
from spmd.named_sharding import hlo_sharding_for

__all__ = ["FullyShardedDataParallel", "FSDP", "OutputSharding"]

OutputSharding = PartitionSpec | Callable[[Any, Mesh], Any] | None
"""How the root's outputs are laid out: a spec for every tensor output of enough rank, a
function ``(output, mesh) -> output``, or ``None`` (leave it to GSPMD)."""


class FullyShardedDataParallel(torch.nn.Module):
    """Shard ``module``'s parameters over the ``fsdp`` mesh axis and train it as ZeRO-3.

    ``FSDP(module, ...)`` modifies ``module`` in place and returns it (see the module
    docstring). Each unit (the root, and each submodule the auto-wrap policy picks) gathers
    its parameters for its forward, drops them after, and gathers them again for its
    backward; gradients are reduced to the sharded layout. Plain ``optimizer.step()`` then
    updates the shards. Tensor-parallel layouts compose: give ``param_spec_fn`` specs naming
    other mesh axes too, and those stay in place when the FSDP axis is gathered.

    The arguments are those of `fully_shard`, which this calls.
    """

    _fsdp_runtime: UnitRuntime

    def __new__(cls, module: torch.nn.Module, **options: Any) -> Any:  # type: ignore[misc]
        return fully_shard(module, **options)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: ``__new__`` wrapped the module in place."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's own forward, with this unit's parameters gathered."""
        if "_fsdp_specs" in self.__dict__:  # the root (it alone holds the specs): the model's own inputs
            _check_inputs_on_device(type(self).__name__, args, kwargs)
        inner = super().forward
        out = self._fsdp_runtime.run(inner, args, kwargs)
        shard_output = getattr(self, "_fsdp_shard_output", None)
        if shard_output is not None:
            out = _apply_output_sharding(out, shard_output, self._fsdp_mesh)
        return out

    @property
    def fsdp_units(self) -> list[str]:
        """Paths of the units under this root ('' is the root)."""
        return [u.plan.path for u in self._fsdp_runtime.registry.units]

    @property
    def fsdp_mesh(self) -> Mesh:
        """The mesh the parameters are sharded over."""
        return self._fsdp_mesh

    def fsdp_param_specs(self) -> dict[str, PartitionSpec]:
        """The stored layout of every parameter, by qualified name."""
        return dict(self._fsdp_specs)


FSDP = FullyShardedDataParallel


def _check_inputs_on_device(model: str, args: tuple, kwargs: dict) -> None:
    """A host tensor given to a model whose parameters are on the XLA device: say which and how
    to move it (torch_xla would fail deep inside the model with "Expected XLA tensor")."""
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"{k}=", v) for k, v in kwargs.items()]
    for where, value in named:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device.type == "cpu":
            raise FSDPTypeError(
                f"{model} (FSDP on XLA) got {where} of shape {tuple(value.shape)} on the CPU; its parameters are on "
                "the XLA device. Move inputs there first: x = x.to(torch_xla.device()) (or load batches with "
                "torch_xla's MpDeviceLoader)."
            )


@functools.cache
def _fsdp_class(cls: type[torch.nn.Module]) -> type:
    # Same name as the wrapped class: libraries record class names (Hugging Face writes
    # ``architectures`` into config.json on save_pretrained).
    # The forward keeps the wrapped class's signature: libraries inspect it (the Trainer drops
    # batch keys the forward does not name).
    @functools.wraps(cls.forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return FullyShardedDataParallel.forward(self, *args, **kwargs)

    namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "forward": forward}
    return type(cls.__name__, (FullyShardedDataParallel, cls), namespace)


def _apply_output_sharding(out: Any, shard_output: PartitionSpec | Callable[[Any, Mesh], Any], mesh: Mesh) -> Any:
    if not isinstance(shard_output, PartitionSpec):
        return shard_output(out, mesh)
    spec = shard_output
    if isinstance(out, dict):  # Hugging Face ModelOutput keeps its class on item assignment
        for key in list(out.keys()):
            value = out[key]
            if isinstance(value, torch.Tensor) and value.dim() >= len(spec):
                out[key] = with_sharding_constraint(value, mesh, spec)
        return out
    leaves, tree = tree_flatten(out)
    leaves = [
        with_sharding_constraint(x, mesh, spec) if isinstance(x, torch.Tensor) and x.dim() >= len(spec) else x
        for x in leaves
    ]
    return tree_unflatten(leaves, tree)


def _resolve_mesh(mesh: Mesh | None, fsdp_axis: str) -> Mesh:
    mesh = mesh_or_global(mesh, "FSDP")
    names = mesh.axis_names or ()
    if fsdp_axis not in names:
        raise MeshAxisError(
            f"FSDP shards parameters on mesh axis {fsdp_axis!r}, but {mesh.describe()} has axes {tuple(names)}. "
            f"Name one axis {fsdp_axis!r} (e.g. Mesh(ids, (n, 1), ('fsdp', 'model'))) or pass fsdp_axis=..."
        )
    return mesh


def _resolve_precision(mixed_precision: MixedPrecision | torch.dtype | None) -> MixedPrecision | None:
    if mixed_precision is None or isinstance(mixed_precision, MixedPrecision):
        return mixed_precision
    if isinstance(mixed_precision, torch.dtype):
        return MixedPrecision(compute_dtype=mixed_precision)
    origin = type(mixed_precision).__module__
    hint = (
        f" ({origin}.{type(mixed_precision).__name__} is another library's class: use fsdp_xla.MixedPrecision)"
        if type(mixed_precision).__name__.endswith(("MixedPrecision", "MixedPrecisionPolicy"))
        else ""
    )
    raise FSDPTypeError(
        f"mixed_precision must be a fsdp_xla.MixedPrecision, a torch.dtype or None, got "
        f"{type(mixed_precision).__name__}{hint}."
    )


def _resolve_policy(policy: object) -> WrapPolicy | None:
    if policy is None or isinstance(policy, WrapPolicy):
        return policy
    if isinstance(policy, (list, tuple, set, frozenset)) and policy and all(isinstance(c, type) for c in policy):
        names = ", ".join(sorted(c.__name__ for c in policy))
        raise WrapPolicyError(
            f"auto_wrap_policy got layer classes ({names}), not a policy. Wrap them: "
            f"auto_wrap_policy=transformer_auto_wrap_policy({{{names}}})."
        )
    if isinstance(policy, (list, tuple, set, frozenset)):
        raise WrapPolicyError(
            f"auto_wrap_policy takes one policy, got {len(policy)}: transformer_auto_wrap_policy and "
            "size_based_auto_wrap_policy are mutually exclusive. Keep one (transformer layers for "
            "transformer models: a block's weights are then gathered together)."
        )
    raise WrapPolicyError(
        f"auto_wrap_policy must be a WrapPolicy (transformer_auto_wrap_policy({{Block}}) or "
        f"size_based_auto_wrap_policy(n)), got {policy!r}."
    )


def _is_wrapped(module: torch.nn.Module) -> bool:
    """Wrapped by our FSDP on either backend (on dtensor, torch's ``fully_shard`` makes the
    module an ``FSDPModule``)."""
    if isinstance(module, FullyShardedDataParallel):
        return True
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


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


def fully_shard(
    module: torch.nn.Module,
    *,
    mesh: Mesh | None = None,
    fsdp_axis: str = "fsdp",
    auto_wrap_policy: WrapPolicy | None = None,
    mixed_precision: MixedPrecision | torch.dtype | None = None,
    reshard_after_forward: bool = True,
    gradient_checkpointing: bool = False,
    optimization_barriers: bool = True,
    shard_output: OutputSharding = None,
    param_spec_fn: SpecFn | None = None,
    param_init_fn: Callable[[torch.nn.Module], None] | None = None,
    init_seed: int = 0,
    sync_after_backward: bool | None = None,
    shardable_layer_norm: bool = True,
) -> Any:
    """Shard ``module`` in place for FSDP (`FullyShardedDataParallel` calls this); returns it.

    Args:
        module: the model. On the XLA device, on the host, or built on the meta device with
            `fsdp_xla.deferred_init` (then each unit is initialized straight into its shards).
        mesh: the device mesh; default the global mesh.
        fsdp_axis: the mesh axis parameters are sharded on.
        auto_wrap_policy: which submodules become units of their own: one
            `TransformerWrapPolicy` or `SizeWrapPolicy` (``None``: the root only, ZeRO-2-like).
        mixed_precision: a `MixedPrecision` (or a dtype, for ``MixedPrecision(dtype)``).
        reshard_after_forward: drop gathered parameters after each unit's forward and
            regather for backward (ZeRO-3). ``False`` keeps them until backward.
        gradient_checkpointing: recompute each non-root unit's activations in backward (on
            the dtensor backend with torch's composable ``checkpoint``).
        optimization_barriers: the barriers that keep XLA from merging the backward regather
            with the forward gather (and from hoisting gathers); turn off only to see why
            they are needed.
        shard_output: layout of the root's outputs (`OutputSharding`). On the dtensor
            backend only ``P(fsdp_axis)``, the layout each rank's part of the batch has.
        param_spec_fn: ``(name, parameter) -> PartitionSpec`` for the stored layout; default:
            the FSDP axis on the largest dim it divides (on the dtensor backend: dim 0, and a
            spec may name only ``fsdp_axis``, on one dim).
        param_init_fn: for deferred init, called on each module of a unit after its
            parameters are allocated on the host; default: the module's
            ``reset_parameters()`` and, for Hugging Face models, ``_init_weights``.
        init_seed: seed of deferred init; each module is seeded from it and its path, so
            the weights are the same for any mesh shape and wrap policy.
        sync_after_backward: run forward+backward as one graph and the optimizer step as
            another (a sync when backward ends). Default (``None``): on the CPU backend only.
            XLA's CPU compiler reduces gradients with an all-reduce and slices each shard out
            inside the optimizer's fused kernels, which run last; in one graph every unit's
            full gradient then stays alive until the optimizer. A TPU compile turns the
            reduction into a reduce-scatter, so the shard is all that stays.
        shardable_layer_norm: make each ``nn.LayerNorm`` a `spmd.ShardableLayerNorm`, which
            GSPMD keeps batch-sharded (torch_xla's own lowering all-gathers the activation
            over the whole mesh; see `spmd.layer_norm`).

    Raises:
        MeshAxisError: no mesh, or the mesh has no ``fsdp_axis``.
        WrapPolicyError: a policy that is not a single `WrapPolicy`, or names absent classes.
        FSDPError: the module is already wrapped, or a parameter carries another sharding; on
            the dtensor backend, a ``shard_output`` or ``param_spec_fn`` spec that torch's
            ``fully_shard`` cannot express (see `fsdp_xla._dtensor_fsdp`).
    """
    if not isinstance(module, torch.nn.Module):
        raise FSDPTypeError(f"FSDP wraps an nn.Module, got {type(module).__name__}.")
    if _is_wrapped(module):
        raise FSDPError(f"{type(module).__name__} is already wrapped by FSDP; wrap a model once, at its root.")
    for path, sub in module.named_modules():
        if _is_wrapped(sub):
            raise FSDPError(
                f"Submodule {path!r} is already wrapped by FSDP. Wrap only the root and choose the inner units "
                "with auto_wrap_policy."
            )
    for option, value in (
        ("reshard_after_forward", reshard_after_forward),
        ("gradient_checkpointing", gradient_checkpointing),
        ("optimization_barriers", optimization_barriers),
        ("shardable_layer_norm", shardable_layer_norm),
    ):
        if not isinstance(value, bool):
            raise FSDPTypeError(f"FSDP: {option} must be True or False, got {value!r} ({type(value).__name__}).")
    mesh = _resolve_mesh(mesh, fsdp_axis)
    if shard_output is not None and not isinstance(shard_output, PartitionSpec) and not callable(shard_output):
        raise FSDPTypeError(
            f"shard_output must be a PartitionSpec, a function (output, mesh) -> output, or None; got "
            f"{shard_output!r}. Write P('fsdp') for a tuple spec."
        )
    policy = _resolve_policy(auto_wrap_policy)
    precision = _resolve_precision(mixed_precision)
    if policy is not None:
        policy.check(module)
    first = next(iter(module.parameters()), None)
    if first is not None and backend_for(first).name == "dtensor":
        check_output_sharding(shard_output, fsdp_axis)
        plans = plan_units(module, policy)
        shard_dims = fsdp_shard_dims(plans, mesh, fsdp_axis, param_spec_fn)  # all checked before sharding
        runtime = backend_for(first)
        mesh.check_device_count(runtime.device_count(), runtime.more_devices)
        return fully_shard_on_dtensor(
            module,
            plans,
            shard_dims,
            mesh=mesh,
            fsdp_axis=fsdp_axis,
            precision=precision,
            reshard_after_forward=reshard_after_forward,
            gradient_checkpointing=gradient_checkpointing,
            param_init_fn=param_init_fn,
            init_seed=init_seed,
            device_type=device_type_of(first),
        )
    backend.ensure_spmd()
    mesh.check_device_count(backend.device_count(), backend.TorchXlaBackend.more_devices)

    if shardable_layer_norm:
        use_shardable_layer_norm(module)
    plans = plan_units(module, policy)
    config = UnitConfig(
        compute_dtype=precision.compute_dtype if precision else None,
        reduce_dtype=precision.effective_reduce_dtype if precision else None,
        cast_inputs=precision.cast_inputs if precision else False,
        reshard_after_forward=reshard_after_forward,
        barriers=optimization_barriers,
    )
    if sync_after_backward is None:
        sync_after_backward = backend.platform() == "CPU"
    registry = Registry(sync_after_backward)
    specs: dict[str, PartitionSpec] = {}
    deferred = needs_materialization(module)
    unit_paths = [p.path for p in plans]
    for plan in plans:
        if deferred:
            materialize_unit(module, plan, unit_paths, param_init_fn, init_seed)
        shardings = _place_parameters(plan, mesh, fsdp_axis, param_spec_fn, specs)
        _place_buffers(plan, precision)
        checkpoint = gradient_checkpointing and plan.path != ""
        runtime = UnitRuntime(plan, shardings, config, registry, checkpoint)
        unit = plan.module
        unit.__class__ = _fsdp_class(type(unit))
        unit.__dict__["_fsdp_runtime"] = runtime
        unit.__dict__["_fsdp_mesh"] = mesh
    module.__dict__["_fsdp_shard_output"] = shard_output
    module.__dict__["_fsdp_specs"] = specs
    return module
