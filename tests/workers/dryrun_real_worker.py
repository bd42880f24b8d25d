"""A torchrun worker for the dry-run tests: runs a training script as this real rank (gloo, real
tensors) under the inspector's `Recorder`, the one the dry run uses, and writes the steps it
recorded to ``OUT/rank<r>.json``, each with what the CPU allocator held during the step (every
thread, from the profiler's memory events; `tests.allocator_timeline`), counted from what the
recorder held when it started: ``allocator_peak_bytes``, gloo's staging buffers at that peak
(``backend_staging_at_peak_bytes``), the peak without them (``allocator_peak_without_staging_bytes``),
the tensors among it that gloo's worker thread frees later (``released_by_gloo_at_peak_bytes``),
and gloo's staging at its most (``backend_staging_max_bytes``).

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
from tests.allocator_timeline import PROBE_BYTES, count_every_thread, events_of, step_peaks

MARK = "dryrun-worker-boundary"


def _mark() -> None:
    """A step boundary in the profile, with a probe storage whose event carries the allocator's
    count (an ``UntypedStorage`` is made below the dispatcher: the recorder does not see it)."""
    with record_function(MARK):
        torch.UntypedStorage(PROBE_BYTES)


class MarkingRecorder(Recorder):
    """A `Recorder` that marks in the profile when it starts and where each step ends, and does
    not track the ops a collective's ``wait`` runs.

    Gloo's reduce-scatter all-reduces a clone of its whole input and, in ``wait``, copies this
    rank's chunk out of the clone (``split``, ``copy_``, dispatched on the waiting thread): the
    tracker met the clone there and counted it as a temporary until gloo's worker dropped it
    (measured: +132,864 B, bare ``fully_shard``, and +199,936 B, our FSDP, of temporaries on 1 or
    2 of 8 rank-steps). NCCL's ``wait`` runs no op and the fake group's neither; the clone is
    gloo's staging, which `tests.allocator_timeline` counts apart.
    """

    held_at_start = 0

    def __enter__(self) -> "MarkingRecorder":
        super().__enter__()
        wait = torch.distributed.Work.wait

        def untracked_wait(work, *args, **kwargs):  # type: ignore[no-untyped-def]
            tracker = self._tracker
            if tracker is None:
                return wait(work, *args, **kwargs)
            tracker.propagating += 1  # the recorder's pass-through, as for sharding propagation
            try:
                return wait(work, *args, **kwargs)
            finally:
                tracker.propagating -= 1

        torch.distributed.Work.wait = untracked_wait  # type: ignore[method-assign]
        self._undo.append(lambda: setattr(torch.distributed.Work, "wait", wait))
        return self

    def _optimizer_built(self, optimizer: torch.optim.Optimizer) -> None:
        started = self._tracker is None
        super()._optimizer_built(optimizer)
        if started and self._tracker is not None:
            snapshot = self._tracker.get_tracker_snapshot()
            self.held_at_start = max((s["Total"] for s in snapshot.values()), default=0)
            _mark()

    def _forward_starts(self, module, args) -> None:
        closed = len(self.steps)
        try:
            super()._forward_starts(module, args)
        finally:
            if len(self.steps) > closed:
                _mark()


def main() -> None:
    out, steps, script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    count_every_thread()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with MarkingRecorder(int(steps)) as recorder:
            try:
                runpy.run_path(script, run_name="__main__")
            except StopScript:
                pass
    records = [_step_dict(s) for s in recorder.steps]
    for record, peak in zip(records, step_peaks(events_of(prof, MARK), recorder.held_at_start, len(records))):
        record["allocator_peak_bytes"] = peak.allocator_peak_bytes
        record["backend_staging_at_peak_bytes"] = peak.staging_at_peak_bytes
        record["allocator_peak_without_staging_bytes"] = peak.peak_without_staging_bytes
        record["released_by_gloo_at_peak_bytes"] = peak.released_by_gloo_at_peak_bytes
        record["backend_staging_max_bytes"] = peak.staging_max_bytes
    Path(out, f"rank{os.environ['RANK']}.json").write_text(json.dumps(records))


if __name__ == "__main__":
    main()
