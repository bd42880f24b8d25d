"""torch's memory trackers, recording what one rank holds and sends in a step: memory by
category (from the storages of the tensors the dispatcher creates), its peak with the module
and phase, and every collective in order (`StepRecord`). `FsdpTracker` for a ``fully_shard``-ed
root (``FSDPMemTracker``, which tells sharded from gathered parameters), `PlainTracker` for
anything else (``MemTracker``: tensor parallel plans, ``mark_sharding``, plain modules).

Two corrections to the tracker:

- DTensor computes its output shapes by running the op on fake tensors
  (``ShardingPropagator._propagate_tensor_meta_non_cached``). Under a dry run's fake mode those
  are the same kind of tensor as the rank's own, so the tracker counted them (global shapes: the
  optimizer state came out 36 % too high at 4 ranks, 44x at 1,024). Ops run there pass through
  untracked.
- The tracker's peak covers its whole life; a step's peak, each category's maximum over the
  step, and the module and phase at the peak are kept here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from spmd._util.memory import MemoryUsage
from spmd._util.torch_compat import TOTAL_KEY as _TOTAL_KEY
from spmd._util.torch_compat import FSDPMemTracker, MemTracker
from spmd._util.torch_compat import MemRefType as _MemRefType
from spmd.inspector._dtensor.collectives import CollectiveCall, collective_call, is_collective
from spmd.inspector.report import StepTotals

__all__ = ["CATEGORIES", "PLAIN_CATEGORIES", "FsdpTracker", "PlainTracker", "Recording", "StepRecord"]

CATEGORIES = {
    "Sharded Param": "sharded_parameters",
    "Unsharded Param": "unsharded_parameters",
    "Buffer": "buffers",
    "Sharded Grad": "sharded_gradients",
    "Unsharded Grad": "unsharded_gradients",
    "OptState": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "All Gather": "all_gather_buffers",
    "Reduce Scatter": "reduce_scatter_buffers",
    "Inputs": "inputs",
}
"""``FSDPMemTracker``'s category names -> the report's."""

PLAIN_CATEGORIES = {
    "Parameter": "sharded_parameters",
    "Buffer": "buffers",
    "Gradient": "sharded_gradients",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "inputs",
}
"""``MemTracker``'s (no FSDP) -> the report's: a parameter as the rank stores it (its shard of a
tensor parallel or ``mark_sharding`` layout, a replicated one whole) is a sharded parameter;
there is no gathered copy. "Other" holds only the root's inputs (`PlainTracker.track_inputs`)."""


@dataclass(frozen=True)
class StepRecord:
    """One step of one rank.

    Attributes:
        step: 0 for the first step the recorder saw.
        memory: the step's peak, bytes per category at that moment (``at_peak``, `CATEGORIES`
            names) and each category's own maximum over the step (``category_max``).
        module: the innermost module running at the peak ('' outside any).
        phase: ``forward``, ``backward``, ``optimizer`` or ``other`` at the peak.
        collectives: every collective of the step, in issue order.
        complete: False when the script stopped (or failed) inside the step.
    """

    step: int
    memory: MemoryUsage
    module: str
    phase: str
    collectives: tuple[CollectiveCall, ...]
    complete: bool = True

    @property
    def peak_bytes(self) -> int:
        """The most the rank held at once during the step."""
        return self.memory.peak_bytes

    @property
    def at_peak(self) -> dict[str, int]:
        """Bytes per category at the peak."""
        return dict(self.memory.at_peak)

    @property
    def category_max(self) -> dict[str, int]:
        """Each category's own maximum over the step."""
        return dict(self.memory.category_max)

    @property
    def bytes_sent(self) -> int:
        """Ring-algorithm bytes the rank sends in the step."""
        return sum(c.bytes_sent for c in self.collectives)

    def totals(self) -> StepTotals:
        """The step as the report's ``steps`` hold it on both backends."""
        kinds = dict(Counter(c.op for c in self.collectives))
        return StepTotals(self.step, (), kinds, self.bytes_sent, self.peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The step's entry in a rank's JSON ``steps`` (what a real run is held to)."""
        return {
            "step": self.step,
            "complete": self.complete,
            "peak_bytes": self.peak_bytes,
            "peak_module": self.module,
            "peak_phase": self.phase,
            "at_peak": self.at_peak,
            "category_max": self.category_max,
            "bytes_sent": self.bytes_sent,
            "collectives": [c.to_dict() for c in self.collectives],
        }


def _categories(snapshot: dict[str, int]) -> dict[str, int]:
    names = PLAIN_CATEGORIES if "Parameter" in snapshot else CATEGORIES  # MemTracker's snapshot, or FSDP's
    return {ours: int(snapshot.get(theirs, 0)) for theirs, ours in names.items()}


class Recording:
    """What both trackers add to torch's: collectives and a per-step peak (a mixin before the
    tracker class: `PlainTracker`, `FsdpTracker`)."""

    categories = CATEGORIES

    def start_recording(self) -> None:
        self.propagating = 0
        self.units: list[str] = []  # the FSDP unit gathering or reducing now, innermost last
        self.collectives: list[CollectiveCall] = []
        self.start_step()

    def start_step(self) -> None:
        self.collectives = []
        self.step_peak, self.step_at_peak, self.step_where = -1, {}, ("", "other")
        self.category_max: dict[str, int] = {}

    def where(self) -> tuple[str, str]:
        """(innermost module, phase) now."""
        tracker = self._mod_tracker
        names = [p for p in tracker.parents if p != "Global"]
        module = max(names, key=lambda n: (n.count("."), len(n)), default="")
        # ModTracker names modules from the root's class (FSDPGPT.h.0): the path from the root reads better.
        root = type(self._root_mod).__name__
        module = module.removeprefix(root + ".") if module != root else root.removeprefix("FSDP")
        if self._in_opt:
            return module, "optimizer"
        if tracker.is_bw:
            return module, "backward"
        return module, "forward" if names else "other"

    def _update_peak_stats(self, peak_state: Any) -> None:
        super()._update_peak_stats(peak_state)
        self.note_memory()

    def note_memory(self) -> None:
        # One device per rank here (each rank's own); the largest if a script uses more.
        snap = max(self._curr_mem_snap.values(), key=lambda s: s[_TOTAL_KEY], default=None)
        if snap is None:
            return
        for theirs, ours in self.categories.items():
            self.category_max[ours] = max(self.category_max.get(ours, 0), int(snap.get(theirs, 0)))
        if snap[_TOTAL_KEY] > self.step_peak:
            self.step_peak, self.step_at_peak, self.step_where = snap[_TOTAL_KEY], _categories(snap), self.where()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if self.propagating:  # DTensor's shape propagation, not the rank's memory
            return func(*args, **(kwargs or {}))
        result = super().__torch_dispatch__(func, types, args, kwargs)
        if result is not NotImplemented and is_collective(func):
            module, phase = self.where()
            module = self.units[-1] if self.units else module
            call = collective_call(
                func, args, kwargs or {}, result, position=len(self.collectives), phase=phase, module=module
            )
            self.collectives.append(call)
        return result

    def finish_step(self, step: int, complete: bool) -> StepRecord:
        self.note_memory()  # a step with no op since its start still has what it holds
        module, phase = self.step_where
        memory = MemoryUsage(
            max(self.step_peak, 0), at_peak=dict(self.step_at_peak), category_max=dict(self.category_max)
        )
        record = StepRecord(step, memory, module, phase, tuple(self.collectives), complete)
        self.start_step()
        self.reset_mod_stats()  # the tracker refuses a module's second call without it
        return record


class FsdpTracker(Recording, FSDPMemTracker):
    """``FSDPMemTracker`` that also records collectives and a per-step peak."""

    def __init__(self, root: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        FSDPMemTracker.__init__(self, root, optimizer)
        self.start_recording()


class PlainTracker(Recording, MemTracker):
    """``MemTracker`` (a model with no ``fully_shard``) that also records collectives and a
    per-step peak; the root's parameters, buffers and the optimizer's state made before it
    started are counted from the start."""

    categories = PLAIN_CATEGORIES

    def __init__(self, root: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        MemTracker.__init__(self)
        self._root_mod = root
        self.track_external(root, *([optimizer] if optimizer is not None else []))
        self.start_recording()

    def track_inputs(self, inputs: Any) -> None:
        """Count the root's input tensors as inputs (``FSDPMemTracker.track_inputs``'s job)."""
        from spmd._util.torch_compat import tree_map_only

        tree_map_only(torch.Tensor, lambda t: self._update_and_maybe_create_winfos(t, _MemRefType.OTH), inputs)
