"""What one rank holds and sends, step by step: torch's memory tracker (memory by category, from
the storages of the tensors the dispatcher creates) and every collective in order.

The same recorder runs in a dry run (fake process group, fake tensors) and in a real one (gloo,
real tensors); the tests hold one to the other. It starts itself from what every training
script has, so none needs a change:

- when the script builds an optimizer, the outermost module holding its parameters is the root
  followed (the ``fully_shard``-ed one, if any: ``FSDPMemTracker``, which tells sharded from
  gathered parameters; else ``MemTracker``, for tensor parallel plans, ``mark_sharding`` or plain
  modules), and a step ends at the optimizer's ``step``;
- a script with no optimizer (it updates the weights itself) is followed from the first module
  called that has parameters, and a step ends at its backward.

What runs after a step's end until the root's next forward (a loss all-reduced for logging)
still belongs to that step.

The trackers themselves, with their two corrections, are `spmd.inspector._dtensor.tracker`.
"""

from __future__ import annotations

import functools
import gc
import threading
from typing import Any

import torch

from spmd._util.torch_compat import tree_leaves
from spmd.inspector._dtensor.params import ParameterSummary, summarize_parameters
from spmd.inspector._dtensor.tracker import CATEGORIES, FsdpTracker, PlainTracker, Recording, StepRecord
from spmd.inspector._runner import StopScript

__all__ = ["CATEGORIES", "StepRecord", "Recorder", "StopScript", "ThreadNotFollowedError"]


class ThreadNotFollowedError(RuntimeError):
    """A module ran in a thread other than the script's own: a dry run's fake tensors and its
    memory tracker are per thread, so it cannot follow training there."""


def _outermost(modules: list[torch.nn.Module], params: set[int]) -> list[torch.nn.Module]:
    """Those of ``modules`` holding any of ``params`` that no other of them contains, the one
    holding the most first."""
    holding = [m for m in modules if any(id(p) in params for p in m.parameters())]
    inner = {id(sub) for m in holding for sub in m.modules() if sub is not m}
    roots = [m for m in holding if id(m) not in inner]
    return sorted(roots, key=lambda m: -sum(id(p) in params for p in m.parameters()))


def _root_of(optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
    """The module a step of ``optimizer`` trains: the outermost ``fully_shard``-ed module holding
    its parameters if there is one (a wrapper around it would hide FSDP from the tracker), else
    the outermost module holding them."""
    from torch.distributed.fsdp import FSDPModule

    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    modules = [o for o in gc.get_objects() if issubclass(type(o), torch.nn.Module)]  # type(): no lazy __class__
    fsdp = _outermost([m for m in modules if issubclass(type(m), FSDPModule)], params)
    found = fsdp or _outermost(modules, params)
    return found[0] if found else None


def _is_fsdp(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return issubclass(type(module), FSDPModule)


def _tracker_for(root: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> Recording:
    from torch.distributed.fsdp import FSDPModule

    kind = FsdpTracker if issubclass(type(root), FSDPModule) else PlainTracker
    return kind(root, optimizer)


class Recorder:
    """Records ``steps`` steps of the process's training loop (the module docstring says which);
    a context manager around the script. The step after the last raises `StopScript` (at the
    root's forward), so a script's loop ends there.

    Attributes:
        steps: the records, in order (`StepRecord`).
        root: the tracked root module's class name ('' until one is found).
        parameters: its parameters summed (`ParameterSummary`), once found.
        fsdp: whether the root is ``fully_shard``-ed.
    """

    def __init__(self, steps: int | None) -> None:
        self.max_steps = steps
        self.steps: list[StepRecord] = []
        self.root = ""
        self.fsdp = False
        self.parameters: ParameterSummary | None = None
        self._tracker: Recording | None = None
        self._root: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None  # the one whose step ends a step
        self._step_done = False
        # A fully_shard-ed module called before any optimizer, to follow from between steps
        # (`_start_between_steps`): the module, and the hook on its call's end (or None once it ended).
        self._pending: torch.nn.Module | None = None
        self._pending_hook: Any = None
        self._names: dict[int, str] = {}
        self._undo: list[Any] = []

    # Hooks -------------------------------------------------------------------------------
    def _optimizer_built(self, optimizer: torch.optim.Optimizer) -> None:
        if self._tracker is not None and (self._optimizer is not None or self.steps):
            return
        root = _root_of(optimizer)
        if root is None:
            return
        self._drop_pending()
        if self._tracker is not None:  # followed from a forward before any step: the optimizer says what trains
            tracker, self._tracker = self._tracker, None
            tracker.__exit__(None, None, None)
        self._optimizer = optimizer
        self._start(root, optimizer)

    def _start(self, root: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self._root, self.root = root, type(root).__name__.removeprefix("FSDP")
        self.parameters = summarize_parameters(root)
        self._names = {id(m): name or self.root for name, m in root.named_modules()}
        self._tracker = _tracker_for(root, optimizer)
        self.fsdp = isinstance(self._tracker, FsdpTracker)
        self._tracker.__enter__()

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._tracker is not None:
            self._step_done = True

    def _backward_done(self) -> None:
        if self._pending is not None and self._pending_hook is None:
            self._start_pending()
            return
        if self._tracker is not None and self._optimizer is None:
            self._step_done = True

    def _forward_starts(self, module: torch.nn.Module, args: Any) -> None:
        # A thread the script started (not one of torch's own, such as autograd's device threads,
        # which Python sees as dummy threads).
        thread = threading.current_thread()
        if threading.get_ident() != self._thread and not isinstance(thread, threading._DummyThread):
            raise ThreadNotFollowedError(
                f"the script called {type(module).__name__} in a thread of its own "
                f"({threading.current_thread().name}); the dry run follows only the thread that runs the script (its "
                "fake tensors and memory tracker are per thread), so it cannot follow this script: run the training "
                "loop in the script's main thread to dry-run it"
            )
        if self._pending is not None:  # before the fully_shard-ed module's step ends
            return
        started = self._tracker is None and next(module.parameters(), None) is not None
        if started and _is_fsdp(module):
            self._start_between_steps(module)
            return
        if started:
            self._start(module, None)  # no optimizer built: the first module called with parameters
        if module is not self._root or self._tracker is None:
            return
        if self._step_done:
            self.steps.append(self._tracker.finish_step(len(self.steps), complete=True))
            self._step_done = False
            if self.max_steps is not None and len(self.steps) >= self.max_steps:
                raise StopScript
        elif not started and not self._tracker._mod_tracker.is_bw:
            # The root again within a step (gradient accumulation): the tracker refuses a root's
            # second forward until its per-module stats are reset; the step's own are kept here.
            self._tracker.reset_mod_stats()
        self._tracker.track_inputs(args)
        if started:  # torch runs the global hooks it had when this call began: not the tracker's
            self._tracker._mod_tracker._fw_pre_hook(module, args)

    def _start_between_steps(self, module: torch.nn.Module) -> None:
        """Follow a ``fully_shard``-ed module called before any optimizer was built (an
        evaluation under ``torch.no_grad()``, a script with no optimizer) from between steps: from
        the end of this call when it computes no gradients, else from the end of its backward.
        ``FSDPMemTracker`` re-registers the module's FSDP hooks as it starts: this call has read
        them already (it would call the old pre-forward hook without its arguments), and the
        backward of a forward it did not see finds no record of it."""

        def ended(module: torch.nn.Module, args: Any, output: Any) -> None:
            self._pending_hook.remove()
            self._pending_hook = None
            outputs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
            if not any(t.requires_grad for t in outputs):
                self._start_pending()

        self._pending = module
        self._pending_hook = module.register_forward_hook(ended)

    def _drop_pending(self) -> None:
        if self._pending_hook is not None:
            self._pending_hook.remove()
        self._pending = self._pending_hook = None

    def _start_pending(self) -> None:
        module, self._pending = self._pending, None
        if module is not None and self._tracker is None:
            self._start(module, None)

    def _backward(self, original: Any) -> Any:
        """``torch.autograd.backward`` (what ``loss.backward()`` calls) that ends a step when
        the script has no optimizer to end it."""

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self._backward_done()
            return result

        return backward

    def _propagating(self, original: Any) -> Any:
        def propagate(prop: Any, *args: Any, **kwargs: Any) -> Any:
            tracker = self._tracker
            if tracker is None:
                return original(prop, *args, **kwargs)
            tracker.propagating += 1
            try:
                return original(prop, *args, **kwargs)
            finally:
                tracker.propagating -= 1

        return propagate

    def _repadding(self, original: Any) -> Any:
        """FSDP2's ``reset_sharded_param`` (at the root's first forward) keeps a padded shard
        when the parameter still views it, which it tells by ``data_ptr``, and only for plain
        tensors: a fake shard is padded anew, a new storage a real run never makes (an uneven
        shard counted as an activation). On fake tensors the storages are compared instead and
        an unchanged shard is kept, with the new one untracked, as a real run keeps it."""
        from spmd._util.torch_compat import FakeTensor

        def reset(param: Any) -> Any:
            data, sharded = param._sharded_param_data, param.sharded_param
            info = param._module_info
            local = getattr(sharded, "_local_tensor", None)
            unchanged = (
                isinstance(data, FakeTensor)
                and getattr(info.module, info.param_name) is sharded
                and local is not None
                and local.untyped_storage()._cdata == data.untyped_storage()._cdata
            )
            if not unchanged or self._tracker is None:
                return original(param)
            self._tracker.propagating += 1
            try:
                return original(param)
            finally:
                self._tracker.propagating -= 1
                param._sharded_param_data, sharded._local_tensor = data, local

        return reset

    def _in_unit(self, original: Any) -> Any:
        """An ``FSDPParamGroup`` method whose collectives are filed under the group's unit: the
        all-gather of a unit prefetched for backward is issued while autograd runs another unit's
        backward (where torch's ModTracker would file it), and in a real run it races the hook
        that enters that unit."""

        def call(group: Any, *args: Any, **kwargs: Any) -> Any:
            tracker = self._tracker
            if tracker is None:
                return original(group, *args, **kwargs)
            names = [self._names[id(m)] for m in group.modules if id(m) in self._names]
            tracker.units.append(",".join(names))
            try:
                return original(group, *args, **kwargs)
            finally:
                tracker.units.pop()

        return call

    # Context -----------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from spmd._util.torch_compat import FSDPParam, FSDPParamGroup, ShardingPropagator

        self._thread = threading.get_ident()
        built = torch.optim.Optimizer.__init__

        def init(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            built(optimizer, *args, **kwargs)
            self._optimizer_built(optimizer)

        propagate = ShardingPropagator._propagate_tensor_meta_non_cached
        repad = FSDPParam.reset_sharded_param
        torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign]
        ShardingPropagator._propagate_tensor_meta_non_cached = self._propagating(propagate)  # type: ignore[method-assign]
        FSDPParam.reset_sharded_param = self._repadding(repad)  # type: ignore[method-assign]
        gather, reduce = FSDPParamGroup.unshard, FSDPParamGroup.post_backward
        backward = torch.autograd.backward
        torch.autograd.backward = self._backward(backward)
        FSDPParamGroup.unshard = self._in_unit(gather)  # type: ignore[method-assign]
        FSDPParamGroup.post_backward = self._in_unit(reduce)  # type: ignore[method-assign]
        self._undo = [
            lambda: setattr(torch.autograd, "backward", backward),
            lambda: setattr(FSDPParamGroup, "unshard", gather),
            lambda: setattr(FSDPParamGroup, "post_backward", reduce),
            lambda: setattr(torch.optim.Optimizer, "__init__", built),
            lambda: setattr(ShardingPropagator, "_propagate_tensor_meta_non_cached", propagate),
            lambda: setattr(FSDPParam, "reset_sharded_param", repad),
            register_optimizer_step_post_hook(self._optimizer_stepped).remove,
            register_module_forward_pre_hook(self._forward_starts).remove,
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the step in progress (incomplete unless its optimizer step ran) and undo the hooks."""
        try:
            if self._tracker is not None:
                tracker, self._tracker = self._tracker, None
                if tracker.collectives or self._step_done or not self.steps:
                    self.steps.append(tracker.finish_step(len(self.steps), complete=self._step_done))
                tracker.__exit__(None, None, None)
        finally:
            for undo in reversed(self._undo):
                undo()
            self._undo = []
            self._drop_pending()
