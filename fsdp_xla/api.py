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
from typing import Any

import torch

from fsdp_xla._engines import engine_for
from fsdp_xla._module import FSDP, FullyShardedDataParallel, OutputSharding
from fsdp_xla._options import FSDPOptions
from fsdp_xla._sharding import SpecFn
from fsdp_xla.errors import FSDPError, FSDPTypeError
from fsdp_xla.policies import MixedPrecision, WrapPolicy
from mesh import Mesh
from spmd._backend import backend_for

__all__ = ["FullyShardedDataParallel", "FSDP", "OutputSharding", "fully_shard"]


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

    The keyword arguments are the fields of `FSDPOptions`, documented there; it checks them.

    Raises:
        MeshAxisError: no mesh, or the mesh has no ``fsdp_axis``.
        WrapPolicyError: a policy that is not a single `WrapPolicy`, or names absent classes.
        FSDPError: the module is already wrapped, or a parameter carries another sharding; on
            the dtensor backend, a ``shard_output`` or ``param_spec_fn`` spec that torch's
            ``fully_shard`` cannot express (see `fsdp_xla._dtensor_fsdp`).
    """
    _check_module(module)
    options = FSDPOptions(
        mesh=mesh,
        fsdp_axis=fsdp_axis,
        auto_wrap_policy=auto_wrap_policy,
        mixed_precision=mixed_precision,
        reshard_after_forward=reshard_after_forward,
        gradient_checkpointing=gradient_checkpointing,
        optimization_barriers=optimization_barriers,
        shard_output=shard_output,
        param_spec_fn=param_spec_fn,
        param_init_fn=param_init_fn,
        init_seed=init_seed,
        sync_after_backward=sync_after_backward,
        shardable_layer_norm=shardable_layer_norm,
    )
    if options.auto_wrap_policy is not None:
        options.auto_wrap_policy.check(module)
    first = next(iter(module.parameters()), None)
    engine = engine_for(backend_for(first))
    engine.check(module, options)  # everything refused before anything is sharded
    return engine.apply(module, options)


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
