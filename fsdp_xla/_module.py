"""`FullyShardedDataParallel`: the class an FSDP-wrapped module (and each unit) becomes on GSPMD,
and what its forward does around the wrapped module's own: the root's input check and output
layout. The wrapped class keeps its name and forward signature (see `fsdp_class`).

`fully_shard` (which ``FSDP(...)`` is) lives here too: it picks the backend's FSDP, which
shards the units, and then makes each GSPMD unit an instance of this class. So the backends never
import this class, and the class needs no import to construct itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from fsdp_xla._axes import AxisNames
from fsdp_xla._backends import fsdp_backend_for
from fsdp_xla._dtensor_fsdp import wrap_fields
from fsdp_xla._gspmd_unit import GspmdUnit
from fsdp_xla._options import FSDPOptions
from fsdp_xla._replicas import ReplicaSync
from fsdp_xla._rollback import ModuleSnapshot
from fsdp_xla._sharding import SpecFn
from fsdp_xla.errors import FSDPError, FSDPTypeError
from fsdp_xla.policies import MixedPrecision, WrapPolicy
from mesh import Mesh
from spmd import PartitionSpec, with_sharding_constraint
from spmd.backend import agree_on_arguments, backend_for, mesh_text
from spmd.torch_compat import tree_flatten, tree_unflatten

__all__ = ["FSDP", "FullyShardedDataParallel", "OutputSharding", "fsdp_class", "fully_shard"]

OutputSharding = PartitionSpec | Callable[[Any, Mesh], Any] | None
"""How the root's outputs are laid out: a spec for every tensor output of enough rank, a
function ``(output, mesh) -> output``, or ``None`` (leave it to GSPMD)."""


class FullyShardedDataParallel(torch.nn.Module):
    """Shard ``module``'s parameters over the ``fsdp`` mesh axis (or axes) and train it as ZeRO-3
    (HSDP where a replicate axis holds copies of the shards).

    ``FSDP(module, ...)`` modifies ``module`` in place and returns it (see the module
    docstring). Each unit (the root, and each submodule the auto-wrap policy picks) gathers
    its parameters for its forward, drops them after, and gathers them again for its
    backward; gradients are reduced to the sharded layout. Plain ``optimizer.step()`` then
    updates the shards. Tensor-parallel layouts compose: give ``param_spec_fn`` specs naming
    other mesh axes too, and those stay in place when the FSDP axis is gathered.

    The arguments are those of `fully_shard`, which this calls.
    """

    _fsdp_unit: GspmdUnit

    def __new__(cls, module: torch.nn.Module, **options: Any) -> Any:
        """``FSDP(module, ...)`` is ``fully_shard(module, ...)``: ``module`` itself, wrapped in place."""
        return fully_shard(module, **options)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: ``__new__`` wrapped the module in place."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's own forward, with this unit's parameters gathered."""
        if "_fsdp_specs" in self.__dict__:  # the root (it alone holds the specs): the model's own inputs
            _check_inputs_on_device(type(self).__name__, args, kwargs)
        inner = super().forward
        out = self._fsdp_unit.run(inner, args, kwargs)
        shard_output = getattr(self, "_fsdp_shard_output", None)
        if shard_output is not None:
            out = _apply_output_sharding(out, shard_output, self._fsdp_mesh)
        return out

    @property
    def fsdp_units(self) -> list[str]:
        """Paths of the units under this root ('' is the root)."""
        return [u.plan.path for u in self._fsdp_unit.registry.units]

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
def fsdp_class(cls: type[torch.nn.Module]) -> type:
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
    fsdp_axis: AxisNames | None = None,
    replicate_axis: AxisNames | ReplicaSync | None = None,
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
        MeshAxisError: no mesh; an axis of ``fsdp_axis`` or ``replicate_axis`` the mesh lacks,
            named twice or in both; the mesh has neither ``fsdp`` nor ``context`` and no
            ``fsdp_axis`` is given.
        WrapPolicyError: a policy that is not a single `WrapPolicy`, or names absent classes.
        FSDPError: the module is already wrapped, or a parameter carries another sharding; on
            the dtensor backend, a ``shard_output`` or ``param_spec_fn`` spec or an axis layout
            that torch's ``fully_shard`` cannot express (see `fsdp_xla._dtensor_fsdp`).
        RankDisagreementError: on the dtensor backend with several processes, one rank's
            arguments were refused and another's not (every rank raises it at once), or the ranks
            wrap different models.
    """

    arguments = dict(locals())  # the keyword arguments are exactly the fields of FSDPOptions
    module = arguments.pop("module")
    first = next(iter(module.parameters()), None) if isinstance(module, torch.nn.Module) else None
    backend = backend_for(first)
    if backend.name == "dtensor":  # one process per device: a rank refusing alone must not leave the others waiting
        fields = {"module": type(module).__name__, "mesh": mesh_text(mesh)}
        check = functools.partial(_checked_options, module, arguments)
        described = functools.partial(wrap_fields, module)
        options = agree_on_arguments(backend, "FSDP arguments", fields, check, _SAME_ARGUMENTS, described)
    else:  # GSPMD: one program over every device, nothing to meet
        options = _checked_options(module, arguments)
    fsdp = fsdp_backend_for(backend)
    fsdp.check(module, options)  # everything refused before anything is sharded
    return _apply_or_roll_back(fsdp, module, options)


def _checked_options(module: torch.nn.Module, arguments: dict[str, Any]) -> FSDPOptions:
    """`fully_shard`'s keyword ``arguments`` checked as one `FSDPOptions`, with ``module`` and
    the wrap policy checked against it."""
    _check_module(module)
    options = FSDPOptions(**arguments)
    if options.auto_wrap_policy is not None:
        options.auto_wrap_policy.check(module)
    return options


def _apply_or_roll_back(fsdp: Any, module: torch.nn.Module, options: FSDPOptions) -> torch.nn.Module:
    """``fsdp.apply``; if it fails part way (what no check can see ahead: a user's init raising
    on a later unit), the model is put back as it was (`fsdp_xla._rollback`)."""
    kept = ModuleSnapshot(module)
    try:
        wrapped = fsdp.apply(module, options)
        _become_fsdp_units(wrapped)
    except BaseException:
        kept.restore()
        raise
    return wrapped


_SAME_ARGUMENTS = (
    "Wrap the same model (parameter names, shapes and dtypes) with the same FSDP arguments over the same mesh on "
    "every rank: one rank runs a stale config, builds the model from another one, or loads other weights first?"
)


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


def _become_fsdp_units(module: torch.nn.Module) -> None:
    """Each unit the GSPMD FSDP built (it holds a `GspmdUnit`) becomes an instance of the FSDP
    subclass of its class; on DTensor, torch's ``fully_shard`` made its units ``FSDPModule``s."""
    for unit in module.modules():
        if "_fsdp_unit" in vars(unit):
            unit.__class__ = fsdp_class(type(unit))
