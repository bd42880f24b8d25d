"""Child processes started by tests: the environment they get, and torchrun launches (CPU, gloo)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ROOT / "tests" / "workers"  # scripts the tests launch as processes


# XLA:CPU's LLVM backend at -O0 for the tests' torch_xla and JAX CPU programs: LLVM's passes were
# about 40 % of the CPU of the torch_xla tests (115 -> 69 CPU s for the checkpoint, context,
# numerics and FSDP-axes modules), and the suite is CPU-bound. The tests check what the programs
# compute and how XLA shards them (its HLO passes and dumps run either way), not how fast
# XLA:CPU's machine code runs; no IEEE-changing option differs between the levels. Never given
# to the planner's libtpu compiles (``child_env(xla=False)``), whose programs are the product.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def child_env(*, xla: bool = True) -> dict[str, str]:
    """This process's environment for a child Python process, with the project importable.

    ``xla=True``: without this session's device count and HLO debug setting, so the child
    configures its own devices (``PJRT_DEVICE`` stays), with `TEST_XLA_FLAGS` alone in
    ``XLA_FLAGS``. ``xla=False``: no XLA, PJRT or device settings at all (torchrun jobs, TPU
    compiles).
    """
    if xla:
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XLA_HLO_DEBUG", "CPU_NUM_DEVICES")}
        env["XLA_FLAGS"] = TEST_XLA_FLAGS
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


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it."""
    for victim in [pid, *_descendants(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _launch_env() -> dict[str, str]:
    """What a launch's ranks get: no XLA device settings, and ``USE_TORCH_XLA=0``."""
    env = child_env(xla=False)
    env["USE_TORCH_XLA"] = "0"
    return env


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
    env = _launch_env()
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
            kill_tree(launch.pid)
            out, err = launch.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(command, launch.returncode, out, err)


_zygote: list[subprocess.Popen] = []
_PARENT_LOG = Path(tempfile.gettempdir()) / f"warm-parent-{os.getpid()}.log"


def _warm_parent() -> subprocess.Popen:
    """The session's warm parent (workers/zygote_worker.py), started at the first warm launch."""
    if not _zygote or _zygote[0].poll() is not None:
        _zygote[:] = [
            subprocess.Popen(
                [sys.executable, str(WORKERS / "zygote_worker.py")], cwd=ROOT, env=_launch_env(), text=True,
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=_PARENT_LOG.open("w"),
            )
        ]  # fmt: skip
    return _zygote[0]


def stop_warm_parent() -> None:
    for parent in _zygote:
        parent.kill()
        parent.wait()
    _zygote.clear()
    _PARENT_LOG.unlink(missing_ok=True)


def _kill_launch(directory: Path) -> None:
    pid_file = directory / "pid"
    if not pid_file.exists():
        return
    kill_tree(int(pid_file.read_text()))


def warm_launch(
    script: Path, nproc: int, *args: str, cwd: Path = ROOT, timeout: int = 600
) -> subprocess.CompletedProcess:
    """``torchrun(script, nproc, *args)`` with each rank forked from a parent that has imported
    torch and the project already: the same environment, output and exit code (1 when a rank
    failed; the others are stopped as torchrun's agent stops them), without four imports of
    torch a launch. For scripts that test what a launch does, not torchrun itself: restarts,
    torchrun's own messages and interpreter exit need ``torchrun``."""
    directory = Path(tempfile.mkdtemp(prefix="warm-launch-"))
    request = {"script": str(script), "args": list(args), "nproc": nproc, "cwd": str(cwd), "dir": str(directory)}
    parent = _warm_parent()
    parent.stdin.write(json.dumps(request) + "\n")
    parent.stdin.flush()
    command = ["warm_launch", str(script), "--nproc", str(nproc), *args]
    deadline = time.monotonic() + timeout
    done = directory / "returncode"
    while not done.exists():
        if parent.poll() is not None and not done.exists():
            raise RuntimeError(
                f"the warm parent (workers/zygote_worker.py) ended with {parent.returncode}: {_PARENT_LOG.read_text()[-2000:]}"
            )
        if time.monotonic() > deadline:
            _kill_launch(directory)
            raise subprocess.TimeoutExpired(command, timeout, *_outputs(directory))
        time.sleep(0.05)
    code = int(done.read_text())
    out, err = _outputs(directory)
    shutil.rmtree(directory, ignore_errors=True)
    return subprocess.CompletedProcess(command, code, out, err)


def _outputs(directory: Path) -> tuple[str, str]:
    return tuple(
        (directory / name).read_text(errors="replace") if (directory / name).exists() else ""
        for name in ("stdout", "stderr")
    )
