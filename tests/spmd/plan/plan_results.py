"""The background run of plan_worker.py: started when collection ends (tests/conftest.py),
awaited by the tests that read its results.

Its sections run in three processes on the current lane (two on the torch_xla lane), each on the
test session's spare CPU (nice 19) and forked from the warm parent that has imported the planner
(tests/background.py). The readers run last and wait for the compiles, and one process left at
the end uses one core of two: with two processes the last 41 s of a 633 s run waited so, 39 % of
the two cores idle. `PARTS` splits the sections by their CPU seconds (plan_worker logs them;
measured alone on the current lane 2026-12-02): the advisor's 109 s, the remat policies' 106 s,
the rest 78 s. On the torch_xla lane its libtpu knows no tpu7x, `CURRENT_LANE_ONLY` is not run
and `ON_DEMAND_ON_TORCH_XLA` only when its readers are selected.
"""

import json
import shutil
import tempfile
from pathlib import Path

from tests.background import BackgroundRun
from tests.conftest import HAS_TORCH_XLA
from tests.torchrun import WORKERS

# The test files that read the worker's results: collecting any of them starts it.
USERS = (
    "test_plan.py", "test_step_options.py", "test_ironwood.py", "test_ceiling.py", "test_plan_context.py",
    "test_refine.py", "test_fused_projections.py",
)  # fmt: skip
# plan_worker's sections, one process each list; the first name names its results file. The
# advisor's sections share one compile cache, so they run in one process (in the order
# plan_worker.sections gives: every_plan reads what advisor and refined_advice cached).
PARTS = (
    ("advisor", "refined_advice", "every_plan", "interrupted_advice"),
    ("policies_and_kernels",),
    ("two_slices", "fused_projections", "ironwood", "device_orders", "errors", "loop_collectives", "fidelity",
     "context_parallel"),
)  # fmt: skip
# `every_plan` checks the advisor's search against every plan it could have tried: Python over
# compiled reports, the same whichever libtpu compiled them, and 99 CPU s of compiles with the
# torch_xla lane's libtpu when it compiled all four of its plans (it now compiles two; not
# measured there since). The current lane runs it; on the torch_xla lane `advisor` and
# `interrupted_advice` still run the advisor on its own libtpu.
CURRENT_LANE_ONLY = ("every_plan",)
# The sections that read or fill the advisor's compile cache, so they share a process.
SHARE_THE_ADVICE_CACHE = ("advisor", "refined_advice", "every_plan")
if HAS_TORCH_XLA:
    # Without `CURRENT_LANE_ONLY`, and with the policies and the refinement on demand (below), the
    # sections that share no cache move to the second process: 139 and 87 CPU s (measured alone)
    # where the current lane's split would leave 226 and a few.
    _sections = [name for part in PARTS for name in part if name not in CURRENT_LANE_ONLY]
    PARTS = (
        tuple(name for name in _sections if name in SHARE_THE_ADVICE_CACHE),
        tuple(name for name in _sections if name not in SHARE_THE_ADVICE_CACHE),
    )
# Sections the torch_xla lane runs on demand (pytest -m slow; their readers are marked
# `child_compile.on_demand_on_torch_xla`), by the fixture those readers use: such a section runs
# when a selected test uses it. Measured alone on that lane (2026-12-02): the remat policies' 4
# compiles 288 CPU s (121 on the current lane), the per-tensor refinement's 49 (26).
ON_DEMAND_ON_TORCH_XLA = {"policies_and_kernels": "reports", "refined_advice": "refined"}
# Up to 20 minutes: what the compiles have taken on this 2-core machine shared with other sessions.
TIMEOUT_SECONDS = 1200
_runs: list[BackgroundRun] = []  # once started; each is given the shared output directory first


def needed(nodeids: list[str]) -> bool:
    return any(f"spmd/plan/{name}" in nodeid for nodeid in nodeids for name in USERS)


def _parts(items: list) -> tuple[tuple[str, ...], ...]:
    """`PARTS` without the on-demand sections no test in ``items`` reads (none on the current lane)."""
    unread = {
        section
        for section, fixture in ON_DEMAND_ON_TORCH_XLA.items()
        if HAS_TORCH_XLA and not any(fixture in getattr(item, "fixturenames", ()) for item in items)
    }
    return tuple(tuple(name for name in part if name not in unread) for part in PARTS)


def start(items: list = ()) -> None:
    """Every part at once, beside the queue of tests/background.py (not in it: the queue's runs
    take turns, and these would hold it for their whole 4 to 5 minutes), with the sections the
    tests ``items`` read. tests.background.stop_all ends them."""
    if _runs:
        return
    out = tempfile.mkdtemp(prefix="plan-worker-")
    worker = (str(WORKERS / "plan_worker.py"),)
    _runs.extend(
        BackgroundRun(worker, None, out, *part, timeout=TIMEOUT_SECONDS, warm=True) for part in _parts(items) if part
    )
    for run in _runs:
        run.start()


def results() -> tuple[dict, Path]:
    """The workers' results, merged, and their output directory (waits for them)."""
    start()
    out = _output_dir()
    merged: dict = {"seconds": {}}
    for run in _runs:
        run.succeeded()
        found = json.loads((out / f"results-{run.args[1]}.json").read_text())
        merged["seconds"].update(found.pop("seconds", {}))
        merged.update(found)
    return merged, out


def _output_dir() -> Path:
    return Path(_runs[0].args[0])


def remove_output() -> None:
    """Remove the workers' output directory (after tests.background.stop_all has ended them)."""
    if _runs:
        shutil.rmtree(_output_dir(), ignore_errors=True)
    _runs.clear()
