"""A torchrun worker for the dry-run tests: runs a training script as this real rank (gloo, real
tensors) under the inspector's `Recorder`, the one the dry run uses, and writes the steps it
recorded to ``OUT/rank<r>.json``, each with ``allocator_peak_bytes``: the allocator's own peak
during the step, from the profiler's memory events (every CPU allocation and free, whoever
makes it), counted from what the recorder held when it started.

    torchrun --nproc_per_node 4 tests/workers/dryrun_real_worker.py OUT STEPS SCRIPT [ARGS]
"""

import json
import os
import runpy
import sys
from pathlib import Path

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from spmd.inspector._dtensor_record import Recorder, StopScript
from spmd.inspector._dtensor_report import _step_dict

MARK = "dryrun-worker-boundary"


class MarkingRecorder(Recorder):
    """A `Recorder` that marks in the profile when it starts and where each step ends."""

    held_at_start = 0

    def _optimizer_built(self, optimizer: torch.optim.Optimizer) -> None:
        started = self._tracker is None
        super()._optimizer_built(optimizer)
        if started and self._tracker is not None:
            snapshot = self._tracker.get_tracker_snapshot()
            self.held_at_start = max((s["Total"] for s in snapshot.values()), default=0)
            with record_function(MARK):
                pass

    def _forward_starts(self, module, args) -> None:
        closed = len(self.steps)
        try:
            super()._forward_starts(module, args)
        finally:
            if len(self.steps) > closed:
                with record_function(MARK):
                    pass


def _timeline(prof) -> list[tuple[int, int | None]]:
    """(time in ns, bytes allocated (negative: freed), or None for a mark), in time order: every
    allocation the profiler saw, on any thread."""
    from torch._C._profiler import _EventType

    found, todo = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        event = todo.pop()
        todo.extend(event.children)
        if event.tag == _EventType.Allocation:
            found.append((event.start_time_ns, event.extra_fields.alloc_size))
        elif event.name == MARK:
            found.append((event.start_time_ns, None))
    return sorted(found, key=lambda item: item[0])


def allocator_peaks(prof, held_at_start: int, steps: int) -> list[int]:
    """Per step, the most the allocator held, counted from ``held_at_start`` at the first mark."""
    peaks, current, base, peak = [], 0, None, 0
    for _, size in _timeline(prof):
        if size is None:
            if base is not None:
                peaks.append(peak - base + held_at_start)
            base = current if base is None else base
            peak = current
        else:
            current += size
            peak = max(peak, current)
    if base is not None and len(peaks) < steps:  # the script ended inside its last step
        peaks.append(peak - base + held_at_start)
    return peaks


def main() -> None:
    out, steps, script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with MarkingRecorder(int(steps)) as recorder:
            try:
                runpy.run_path(script, run_name="__main__")
            except StopScript:
                pass
    records = [_step_dict(s) for s in recorder.steps]
    for record, peak in zip(records, allocator_peaks(prof, recorder.held_at_start, len(records))):
        record["allocator_peak_bytes"] = peak
    Path(out, f"rank{os.environ['RANK']}.json").write_text(json.dumps(records))


if __name__ == "__main__":
    main()
