"""The background run of plan_worker.py: started when collection ends (tests/conftest.py),
awaited by the tests that read its results."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.torchrun import WORKERS, child_env

ROOT = Path(__file__).resolve().parents[3]
# The test files that read the worker's results: collecting any of them starts it.
USERS = ("test_plan.py", "test_step_options.py", "test_ironwood.py", "test_ceiling.py", "test_plan_context.py")
_run: dict = {}


def needed(nodeids: list[str]) -> bool:
    return any(f"spmd/plan/{name}" in nodeid for nodeid in nodeids for name in USERS)


def start() -> None:
    if _run:
        return
    out = Path(tempfile.mkdtemp(prefix="plan-worker-"))
    env = child_env(xla=False)
    log = open(out / "log.txt", "w")
    proc = subprocess.Popen(
        [sys.executable, str(WORKERS / "plan_worker.py"), str(out)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=lambda: os.nice(19),  # the other tests first: this one only waits at the end
    )  # fmt: skip
    _run.update(out=out, proc=proc, log=log)


def results(timeout: float = 1200) -> tuple[dict, Path]:
    """The worker's results.json and its output directory (waits for it: up to 20 minutes, what
    its compiles have taken on this 2-core machine shared with other sessions' compiles)."""
    start()
    proc: subprocess.Popen = _run["proc"]
    code = proc.wait(timeout=timeout)
    _run["log"].close()
    out: Path = _run["out"]
    if code != 0:
        raise RuntimeError(f"plan_worker.py failed ({code}):\n" + (out / "log.txt").read_text()[-6000:])
    return json.loads((out / "results.json").read_text()), out


def stop() -> None:
    """End a worker the session no longer waits for (a run that deselected or failed its readers),
    so no compile outlives the test session, and remove its output."""
    proc = _run.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if "out" in _run:
        shutil.rmtree(_run["out"], ignore_errors=True)
