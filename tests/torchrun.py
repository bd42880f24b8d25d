"""Child processes started by tests: the environment they get, and torchrun launches (CPU, gloo)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ROOT / "tests" / "workers"  # scripts the tests launch as processes


def child_env(*, xla: bool = True) -> dict[str, str]:
    """This process's environment for a child Python process, with the project importable.

    ``xla=True``: without this session's device count, XLA flags and HLO debug setting, so the
    child configures its own devices (``PJRT_DEVICE`` stays). ``xla=False``: no XLA, PJRT or
    device settings at all (torchrun jobs, TPU compiles).
    """
    if xla:
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XLA_HLO_DEBUG", "CPU_NUM_DEVICES")}
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``. torchrun starts each worker in a session of its own, so
    killing torchrun's process group would leave them running, holding the test's pipes."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def torchrun(
    script: Path, nproc: int, *args: str, cwd: Path = ROOT, timeout: int = 600, max_restarts: int = 0
) -> subprocess.CompletedProcess:
    """Run ``script`` with ``nproc`` processes; the project importable, no XLA device settings.
    ``max_restarts``: torchrun restarts all workers that many times when one fails.

    ``USE_TORCH_XLA=0`` keeps transformers/accelerate from importing torch_xla (they do whenever it
    is installed), as on a machine without it: the dtensor backend must not need it.
    On a timeout the whole launch is killed, torchrun and its workers, and
    ``subprocess.TimeoutExpired`` is raised with what they printed.
    """
    env = child_env(xla=False)
    env["USE_TORCH_XLA"] = "0"
    # --standalone: a free port of its own, so launches of concurrent test runs do not collide on 29500.
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        "--max-restarts",
        str(max_restarts),
        str(script),
        *args,
    ]
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as launch:
        try:
            out, err = launch.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [launch.pid, *_descendants(launch.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, err = launch.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(command, launch.returncode, out, err)
