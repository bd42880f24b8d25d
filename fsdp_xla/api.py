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

from collections.abc import Callable
from numbers import Integral
from typing import Any

import torch

from fsdp_xla._engines import engine_for
from fsdp_xla._module import FSDP, FullyShardedDataParallel, OutputSharding
from fsdp_xla._options import FSDPOptions
from fsdp_xla._sharding import SpecFn
from fsdp_xla.errors import FSDPError, FSDPTypeError, MeshAxisError, WrapPolicyError
from fsdp_xla.policies import MixedPrecision, WrapPolicy
from mesh import Mesh, mesh_or_global
from spmd import PartitionSpec
from spmd._backend import backend_for
from spmd.errors import ShardingError
from spmd.sharding._named_sharding import resolve_spec

__all__ = ["FullyShardedDataParallel", "FSDP", "OutputSharding", "fully_shard"]


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

    The keyword arguments are the fields of `FSDPOptions`, documented there.

    Raises:
        MeshAxisError: no mesh, or the mesh has no ``fsdp_axis``.
        WrapPolicyError: a policy that is not a single `WrapPolicy`, or names absent classes.
        FSDPError: the module is already wrapped, or a parameter carries another sharding; on
            the dtensor backend, a ``shard_output`` or ``param_spec_fn`` spec that torch's
            ``fully_shard`` cannot express (see `fsdp_xla._dtensor_fsdp`).
    """
    _check_module(module)
    _check_flags(
        reshard_after_forward=reshard_after_forward,
        gradient_checkpointing=gradient_checkpointing,
        optimization_barriers=optimization_barriers,
        shardable_layer_norm=shardable_layer_norm,
    )
    _check_optional_bool("sync_after_backward", sync_after_backward)
    _check_hooks(param_spec_fn=param_spec_fn, param_init_fn=param_init_fn)
    mesh = _resolve_mesh(mesh, fsdp_axis)
    _check_shard_output(shard_output, mesh)
    options = FSDPOptions(
        mesh=mesh,
        fsdp_axis=fsdp_axis,
        auto_wrap_policy=_resolve_policy(auto_wrap_policy),
        mixed_precision=_resolve_precision(mixed_precision),
        reshard_after_forward=reshard_after_forward,
        gradient_checkpointing=gradient_checkpointing,
        optimization_barriers=optimization_barriers,
        shard_output=shard_output,
        param_spec_fn=param_spec_fn,
        param_init_fn=param_init_fn,
        init_seed=_resolve_seed(init_seed),
        sync_after_backward=sync_after_backward,
        shardable_layer_norm=shardable_layer_norm,
    )
    if options.auto_wrap_policy is not None:
        options.auto_wrap_policy.check(module)
    first = next(iter(module.parameters()), None)
    engine = engine_for(backend_for(first))
    engine.check(module, options)  # everything refused before anything is sharded
    return engine.apply(module, options)


def _construct(cls: type, module: torch.nn.Module, **options: Any) -> Any:
    return fully_shard(module, **options)


# ``FSDP(model, ...)`` is `fully_shard`: set here, where fully_shard lives (the class is in
# fsdp_xla._module, which the engines use and so cannot import this module).
FullyShardedDataParallel.__new__ = staticmethod(_construct)  # type: ignore[method-assign, assignment]


def _check_shard_output(shard_output: object, mesh: Mesh) -> None:
    if shard_output is not None and not isinstance(shard_output, PartitionSpec) and not callable(shard_output):
        raise FSDPTypeError(
            f"shard_output must be a PartitionSpec, a function (output, mesh) -> output, or None; got "
            f"{shard_output!r:.100}. Write P('fsdp') for a tuple spec."
        )
    if isinstance(shard_output, PartitionSpec):  # its axes now, not at the first forward
        try:
            resolve_spec(mesh, shard_output, len(shard_output))
        except ShardingError as e:
            raise type(e)(f"FSDP shard_output={shard_output!r}: {e}") from None


def _check_optional_bool(option: str, value: object) -> None:
    if value is not None and not isinstance(value, bool):  # a string such as 'no' is truthy
        raise FSDPTypeError(f"FSDP: {option} must be True, False or None, got {value!r:.60} ({type(value).__name__}).")


def _check_hooks(**hooks: object) -> None:
    for option, value in hooks.items():
        if value is not None and not callable(value):
            raise FSDPTypeError(
                f"FSDP: {option} must be a function or None, got {value!r:.60} ({type(value).__name__})."
            )


def _resolve_seed(init_seed: object) -> int:
    """``init_seed`` as a Python int (a numpy integer is one; its arithmetic would overflow)."""
    if isinstance(init_seed, bool) or not isinstance(init_seed, Integral):
        raise FSDPTypeError(
            f"FSDP: init_seed must be an int (the seed of deferred init), got {init_seed!r:.60} "
            f"({type(init_seed).__name__})."
        )
    return int(init_seed)


def _check_flags(**flags: object) -> None:
    for option, value in flags.items():
        if not isinstance(value, bool):
            raise FSDPTypeError(f"FSDP: {option} must be True or False, got {value!r} ({type(value).__name__}).")


def _check_module(module: object) -> None:
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
