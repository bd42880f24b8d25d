"""Deferred init: build a model whose parameters take no memory, then let FSDP initialize each
unit straight into its shards, so the unsharded model never exists in host memory.

`deferred_init` runs the model's constructor with every parameter moved to the meta device as
it is registered (buffers stay real: they are small and often cannot be recomputed, such as
attention masks). FSDP then, unit by unit, allocates that unit's parameters on the host, runs
the module's own initialization (``reset_parameters``; for Hugging Face models also
``_init_weights``), sends each parameter to the devices as shards, and frees the host copy.

Each module is seeded from ``init_seed`` and its path in the model, so the weights do not
depend on the mesh shape, the wrap policy or the order units are materialized in.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from fsdp_xla._units import UnitPlan, innermost_unit
from fsdp_xla.errors import DeferredInitError, FSDPTypeError

__all__ = [
    "deferred_init",
    "params_on_meta",
    "needs_materialization",
    "check_materializable",
    "materialize_unit",
    "module_seed",
]

M = TypeVar("M", bound=torch.nn.Module)


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Inside the block, every parameter a module registers is moved to the meta device.

    The constructor's host tensors are allocated but never written (``torch.empty`` pages are
    not touched), so they cost no resident memory. Not thread-safe: it patches
    ``nn.Module.register_parameter`` for the duration of the block.
    """
    original = torch.nn.Module.register_parameter

    def register_on_meta(self: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        original(self, name, param)
        p = self._parameters.get(name)
        if p is not None and p.device.type != "meta":
            # A Parameter subclass keeps its class; a parameter that is a tensor subclass (a fake
            # tensor in the inspector's dry run: ``nn.Parameter`` returns the subclass itself,
            # marked as a parameter) cannot be built from its class alone.
            kind = type(p) if issubclass(type(p), torch.nn.Parameter) else torch.nn.Parameter
            self._parameters[name] = kind(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def deferred_init(build_fn: Callable[..., M], *args: Any, **kwargs: Any) -> M:
    """Build ``build_fn(*args, **kwargs)`` with its parameters on the meta device.

    Example::

        model = fsdp_xla.deferred_init(GPT2LMHeadModel, config)    # no parameter memory
        model = FSDP(model, auto_wrap_policy=transformer_auto_wrap_policy({GPT2Block}))

    Raises:
        TypeError: ``build_fn`` is not callable, did not return an ``nn.Module``, or loads weights
            (``from_pretrained``), which the meta device would silently discard.
    """
    if not callable(build_fn):
        raise FSDPTypeError(
            f"deferred_init takes the model's class or a function that builds it (deferred_init(GPT2LMHeadModel, "
            f"config)), got {build_fn!r:.60} ({type(build_fn).__name__})."
        )
    if getattr(build_fn, "__name__", "") == "from_pretrained":
        raise FSDPTypeError(
            "deferred_init(...from_pretrained, ...) would build the model on the meta device, where the loaded "
            "weights are discarded: FSDP would then initialize it at random. For pretrained weights load the model "
            "first and wrap it (FSDP(Model.from_pretrained(...))), or build it here from its config "
            "(deferred_init(Model, config) or AutoModelForCausalLM.from_config) and load a sharded checkpoint into "
            "the wrapped model (fsdp_xla.checkpoint.load_sharded)."
        )
    with params_on_meta():
        module = build_fn(*args, **kwargs)
    if not isinstance(module, torch.nn.Module):
        raise FSDPTypeError(f"deferred_init: build_fn returned {type(module).__name__}, not an nn.Module.")
    return module


def needs_materialization(module: torch.nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device."""
    return any(p.is_meta for p in module.parameters()) or any(b.is_meta for b in module.buffers())


def module_seed(seed: int, path: str) -> int:
    """The seed of the module at ``path`` (stable across runs and processes)."""
    return (seed * 1_000_003 + zlib.crc32(path.encode())) % (2**63 - 1)


def _init_module(
    root: torch.nn.Module,
    path: str,
    module: torch.nn.Module,
    init_fn: Callable[[torch.nn.Module], None] | None,
    seed: int,
) -> None:
    """Initialize ``module`` (at ``path`` in ``root``) as deferred init does on every backend:
    seeded from ``seed`` and its path, then ``init_fn``, or else its ``reset_parameters()`` and
    the Hugging Face root's ``_init_weights``."""
    torch.manual_seed(module_seed(seed, path))
    if init_fn is not None:
        init_fn(module)
        return
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()
    hf_init = getattr(root, "_init_weights", None)
    if callable(hf_init):
        hf_init(module)


def _unit_modules(root: torch.nn.Module, plan: UnitPlan, unit_paths: list[str]) -> list[tuple[str, torch.nn.Module]]:
    """The modules a unit initializes: its subtree in pre-order, minus nested units' subtrees."""
    return [(path, m) for path, m in root.named_modules() if innermost_unit(path, unit_paths) == plan.path]


def check_materializable(
    root: torch.nn.Module, plans: list[UnitPlan], init_fn: Callable[[torch.nn.Module], None] | None
) -> None:
    """Refuse, before any unit is materialized, what `materialize_unit` would refuse for one of
    ``plans`` (so a refused FSDP call leaves the model as it was).

    Raises:
        DeferredInitError: as `materialize_unit`.
    """
    unit_paths = [p.path for p in plans]
    for plan in plans:
        _check_unit(root, plan, unit_paths, init_fn)


def _check_unit(
    root: torch.nn.Module, plan: UnitPlan, unit_paths: list[str], init_fn: Callable[[torch.nn.Module], None] | None
) -> None:
    if init_fn is not None:
        return
    for name, owner, attr in plan.buffers:
        b = owner._buffers[attr]
        if b is not None and b.is_meta:
            raise DeferredInitError(
                f"Buffer {name!r} {tuple(b.shape)} is on the meta device and its value cannot be recomputed. "
                "Build the model with fsdp_xla.deferred_init(...) (it keeps buffers real) or pass "
                "param_init_fn that fills it."
            )
    if not any(slot.param.is_meta for slot in plan.slots) or callable(getattr(root, "_init_weights", None)):
        return
    own = {id(owner) for slot in plan.slots for owner, _ in slot.owners}
    for path, module in _unit_modules(root, plan, unit_paths):
        has_params = any(True for _ in module.parameters(recurse=False))
        if id(module) in own and has_params and not callable(getattr(module, "reset_parameters", None)):
            raise DeferredInitError(
                f"Module {path or '<root>'!r} ({type(module).__name__}) holds parameters but has no "
                "reset_parameters() to initialize them after deferred init. Add one, or pass "
                "param_init_fn=lambda module: ... to FSDP."
            )


def materialize_unit(
    root: torch.nn.Module,
    plan: UnitPlan,
    unit_paths: list[str],
    init_fn: Callable[[torch.nn.Module], None] | None,
    seed: int,
) -> None:
    """Allocate ``plan``'s meta parameters and buffers on the host and initialize them.

    Raises:
        DeferredInitError: a module holds meta parameters but has no ``reset_parameters``, the
            model has no ``_init_weights`` and no ``init_fn`` was given; or a buffer is on the
            meta device with no ``init_fn`` to fill it.
    """
    _check_unit(root, plan, unit_paths, init_fn)
    allocated = False
    for slot in plan.slots:
        if slot.param.is_meta:
            host = torch.nn.Parameter(torch.empty(slot.param.shape, dtype=slot.param.dtype), slot.param.requires_grad)
            for owner, attr in slot.owners:
                owner._parameters[attr] = host
            slot.param = host
            allocated = True
    for _, owner, attr in plan.buffers:
        b = owner._buffers[attr]
        if b is not None and b.is_meta:
            owner._buffers[attr] = torch.empty(b.shape, dtype=b.dtype)
            allocated = True
    if not allocated:
        return
    modules = _unit_modules(root, plan, unit_paths)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for path, module in modules:
            _init_module(root, path, module, init_fn, seed)
