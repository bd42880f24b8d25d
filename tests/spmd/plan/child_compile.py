"""The planner tests that lower or compile a step do it in a fresh interpreter (libtpu and jax stay
out of the test session, torch_xla out of its environment), in the background.

Each such run is a module-level `BackgroundRun`, and each test that reads one says so with
``@pytest.mark.reads(RUN)``. When collection ends, tests/conftest.py queues the runs the selected
tests read; they run one at a time at nice 19 while the other tests run (a
compile is 5 to 35 s of one core, and the multi-process tests leave a core idle while they wait),
and their tests, ordered near the end, read the results. A thread of the session starts each run
the moment the one before it ends: advanced only between tests, the queue stood still through
every test of a minute or more. Two at a time all along took no less (the tests leave little
idle, 2 to 3 % of the suite's CPU), but while a test waits for a run the session uses no CPU:
then two run at once. A test whose run has not started yet starts it, so a module run on its own
works the same. The planner worker's two processes (plan_results.py) are `BackgroundRun`s too
(tests/background.py), started at once rather than queued; `stop_all` ends every run still going
when the session ends.
"""

import threading
from collections.abc import Callable

import pytest

from tests import background
from tests.background import BackgroundRun
from tests.conftest import HAS_TORCH_XLA

# How often the queue's thread looks for an ended run: short beside a compile of 5 s or more.
POLL_SECONDS = 0.25


_queue: list[BackgroundRun] = []  # the runs that take turns
_stopping = threading.Event()
_watcher: threading.Thread | None = None


def python_code(code: str, config: dict, *args: str, timeout: float) -> BackgroundRun:
    """``python -c CODE CONFIG ARGS...``: a lowering or compile the test then reads as JSON."""
    return BackgroundRun(("-c", code), config, *args, timeout=timeout)


# One flash step of the model in CONFIG on v5e:2x2 (fsdp 4, batch 4 x SEQ, remat dots) with the
# splash blocks (`spmd.plan.request.splash_blocks`) and SEQ in ARGS: its layers scanned, and each
# splash kernel's name scope, block table and cost in the step-time model.
_SPLASH_STEP = r"""
import json, re, sys
from spmd.hlo import HloModuleText
from spmd.plan.api import _lower, _request
from spmd.plan.compile.step import compile_step
from spmd.plan.predict import predict_step
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings

seq = int(sys.argv[3])
settings = PlanSettings("v5e:2x2", 1, seq, "bfloat16", "flash", None, "float32", 1, sys.argv[2])
module, hf_config = build_meta_model(sys.argv[1])
request = _request(settings, "fsdp", None, 4, "dots", 4)
lowered, _, _ = _lower(request, module, hf_config, seq, None)
hlo = compile_step(lowered.lowered).hlo_text
kernels = {
    inst.name: {
        "scope": inst.metadata.get("op_name", ""),
        "grid": re.search(r"s(?:8|16|32)\[([\d,]+)\]", inst.attribute("operand_layout_constraints") or "").group(1),
    }
    for instructions in HloModuleText.parse(hlo).computations.values()
    for inst in instructions
    if inst.name.startswith("splash_mha")
}
flops = {e.op: e.flops_per_run for e in predict_step(hlo, request.target).flops_by_op if e.op in kernels}
print(json.dumps({"scanned": lowered.scanned_layers, "kernels": kernels, "flops": flops}))
"""


def splash_step(config: dict, blocks: str, seq: int) -> BackgroundRun:
    """A flash step of ``config`` at sequence length ``seq`` with ``--splash-blocks blocks``
    (`_SPLASH_STEP`), in the background."""
    return python_code(_SPLASH_STEP, config, blocks, str(seq), timeout=1200)


def on_demand_on_torch_xla(test: Callable) -> Callable:
    """Mark a test slow (run by ``pytest -m slow``) on the torch_xla lane only.

    For the planner's feature checks that compile: each is the same lowering through the same
    planner code on both lanes, and what differs is the compiler. The torch_xla lane's (libtpu
    0.0.20, jax 0.7.1) compiled them 1.1 to 2.4 times slower, and the planner's compiles were half
    of that lane's CPU (965 of 1,829 core-s, measured 2026-12-02). The current lane checks them
    every run, with the libtpu TorchTPU runs on; the torch_xla lane compiles each jax 0.7.1 path
    the planner has every run all the same: plans through the CLI (the advisor's), two slices (the
    DCN mesh), splash kernels (the Mosaic IR cap, test_fused_backward), per-tensor remat and
    offload lowered (the layer scan's stacked outputs), and libtpu's start-up (test_quiet_start).
    """
    return pytest.mark.slow(test) if HAS_TORCH_XLA else test


def runs_read_by(item: pytest.Item) -> list[BackgroundRun]:
    """The runs ``item`` reads (its ``reads`` marks)."""
    return [run for mark in item.iter_markers("reads") for run in mark.args]


def queue(runs: list[BackgroundRun]) -> None:
    """Run ``runs`` one after another in the background, each once: a thread starts the next
    when the one before it ends (`advance`)."""
    global _watcher
    with background.lock:
        for run in runs:
            if run not in _queue:
                _queue.append(run)
        advance()
        if (_watcher is None or not _watcher.is_alive()) and _queue:
            _stopping.clear()
            _watcher = threading.Thread(target=_advance_until_all_started, name="compile-queue", daemon=True)
            _watcher.start()


def advance() -> None:
    """Start the next queued run when none is running, or two at a time while a test waits for a
    run (at the end of the session, where the queue used one core of two and left the other idle)."""
    with background.lock:
        slots = 2 if background.session_waits() else 1
        free = slots - sum(run.running() for run in _queue)
        for run in [run for run in _queue if not run.started()][: max(free, 0)]:
            run.start()


def _advance_until_all_started() -> None:
    while not _stopping.wait(POLL_SECONDS):
        advance()
        with background.lock:
            if all(run.started() for run in _queue):
                return


def stop_all() -> None:
    """End every run still going, queued or started on its own, and remove their files."""
    global _watcher
    _stopping.set()
    if _watcher is not None:
        _watcher.join()
        _watcher = None
    with background.lock:
        background.stop_all()
        _queue.clear()
