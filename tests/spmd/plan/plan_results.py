"""The background run of plan_worker.py: started when collection ends (tests/conftest.py),
awaited by the tests that read its results.

Its sections run in two processes, each on the test session's spare CPU (nice 19): the readers
run last and wait for the compiles, and one process left at the end used one core of two, so
the wait was the long pole of the suite (732 s of a loaded 2,016 s run). `PARTS` splits the
sections by their CPU seconds (plan_worker logs them): about 170 s and 220 s on the current lane,
265 s and 220 s on the torch_xla lane (its libtpu compiles the policies slower and no tpu7x).
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.spmd.plan.child_compile import NICE
from tests.torchrun import ROOT, WORKERS, child_env

# The test files that read the worker's results: collecting any of them starts it.
USERS = (
    "test_plan.py", "test_step_options.py", "test_ironwood.py", "test_ceiling.py", "test_plan_context.py",
    "test_refine.py",
)  # fmt: skip
# plan_worker's sections, one process each list; the first name names its results file.
PARTS = (
    ("policies_and_kernels", "two_slices", "interrupted_advice", "refined_advice"),
    ("advisor", "ironwood", "device_orders", "errors", "loop_collectives", "fidelity", "context_parallel",
     "every_plan"),
)  # fmt: skip
_run: dict = {}


def needed(nodeids: list[str]) -> bool:
    return any(f"spmd/plan/{name}" in nodeid for nodeid in nodeids for name in USERS)


def start() -> None:
    if _run:
        return
    out = Path(tempfile.mkdtemp(prefix="plan-worker-"))
    env = child_env(xla=False)
    procs = []
    for part in PARTS:
        log = open(out / f"log-{part[0]}.txt", "w")
        proc = subprocess.Popen(
            [*NICE, sys.executable, str(WORKERS / "plan_worker.py"), str(out), *part],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,  # the other tests first: read at the end
        )  # fmt: skip
        procs.append((part, proc, log))
    _run.update(out=out, procs=procs)


def results(timeout: float = 1200) -> tuple[dict, Path]:
    """The workers' results, merged, and their output directory (waits for them: up to 20
    minutes, what their compiles have taken on this 2-core machine shared with other sessions')."""
    start()
    out: Path = _run["out"]
    merged: dict = {"seconds": {}}
    for part, proc, log in _run["procs"]:
        code = proc.wait(timeout=timeout)
        log.close()
        if code != 0:
            text = (out / f"log-{part[0]}.txt").read_text()[-6000:]
            raise RuntimeError(f"plan_worker.py {' '.join(part)} failed ({code}):\n{text}")
        found = json.loads((out / f"results-{part[0]}.json").read_text())
        merged["seconds"].update(found.pop("seconds", {}))
        merged.update(found)
    return merged, out


def stop() -> None:
    """End workers the session no longer waits for (a run that deselected or failed their
    readers), so no compile outlives the test session, and remove their output."""
    for _, proc, _ in _run.get("procs", ()):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if "out" in _run:
        shutil.rmtree(_run["out"], ignore_errors=True)
