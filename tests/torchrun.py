"""Child processes started by tests: the environment they get, and torchrun launches (CPU, gloo)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
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


def _stat_fields(stat: Path) -> list[str] | None:
    """A ``/proc/PID/stat`` file's fields after the command name (which may hold spaces and
    parentheses): state first, then the parent's pid; None once the process is gone."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``. torchrun starts each worker in a session of its own, so
    killing torchrun's process group would leave them running, holding the test's pipes."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if fields is not None:
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


def launch_env() -> dict[str, str]:
    """What a launch's ranks get: no XLA device settings, and ``USE_TORCH_XLA=0``."""
    env = child_env(xla=False)
    env["USE_TORCH_XLA"] = "0"
    return env


def torchrun_arguments(script: Path, nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    """What follows ``python`` in a launch of ``script`` on ``nproc`` processes.
    ``--standalone``: a free port of its own, so launches of concurrent test runs (and of the
    session's background runs) do not collide on 29500."""
    return [
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
        "--max-restarts", str(max_restarts), str(script), *args,
    ]  # fmt: skip


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
    command = [sys.executable, *torchrun_arguments(script, nproc, *args, max_restarts=max_restarts)]
    with subprocess.Popen(
        command, cwd=cwd, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as launch:
        try:
            out, err = launch.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(launch.pid)
            out, err = launch.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(command, launch.returncode, out, err)


KILL_WAIT_SECONDS = 10  # a warm parent forks the leader within a second of a request, when idle
_zygotes: dict[bool, subprocess.Popen] = {}  # the warm parents, by whether they import the planner
_zygote_lock = threading.Lock()  # a test's thread and the background queue's both start launches


def _parent_log(planner: bool) -> Path:
    return Path(tempfile.gettempdir()) / f"warm-parent{'-planner' if planner else ''}-{os.getpid()}.log"


def _warm_parent(planner: bool) -> subprocess.Popen:
    """The session's warm parent (workers/zygote_worker.py), started at its first launch; with
    ``planner``, the one that has imported jax and the planner too."""
    parent = _zygotes.get(planner)
    if parent is None or parent.poll() is not None:
        command = [sys.executable, str(WORKERS / "zygote_worker.py"), *(["--planner"] if planner else [])]
        parent = _zygotes[planner] = subprocess.Popen(
            command, cwd=ROOT, env=launch_env(), text=True, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=_parent_log(planner).open("w"),
        )  # fmt: skip
    return parent


def stop_warm_parent() -> None:
    for planner, parent in _zygotes.items():
        parent.kill()
        parent.wait()
        _parent_log(planner).unlink(missing_ok=True)
    _zygotes.clear()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie included: the leader's parent is init)."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return fields is None or fields[0] == "Z"


class WarmLaunch:
    """A launch of ``script`` on ``nproc`` ranks forked by a warm parent, seen as a
    `subprocess.Popen`: `pid` (its leader's), `poll` and `wait` read what the parent writes to
    ``directory`` (``pid``, ``returncode``; ``stdout`` and ``stderr`` beside them). ``nice``: the
    ranks' niceness; ``planner``: forked from the parent that has imported the planner."""

    def __init__(
        self, script: Path, nproc: int, *args: str, directory: Path, cwd: Path = ROOT, nice: int = 0,
        planner: bool = False,
    ) -> None:  # fmt: skip
        self.args = ["warm_launch", str(script), "--nproc", str(nproc), *args]
        self.directory, self.returncode, self._planner = directory, None, planner
        request = {"script": str(script), "args": list(args), "nproc": nproc, "cwd": str(cwd), "dir": str(directory)}
        with _zygote_lock:
            self._parent = _warm_parent(planner)
            self._parent.stdin.write(json.dumps(request | {"nice": nice}) + "\n")
            self._parent.stdin.flush()

    @property
    def pid(self) -> int | None:
        path = self.directory / "pid"
        return int(path.read_text()) if path.exists() else None

    def poll(self) -> int | None:
        """Its exit code once it has ended (-9 when it was killed before writing one)."""
        if self.returncode is None:
            pid = self.pid
            ended = pid is not None and _gone(pid)  # before reading returncode, which it writes last
            done = self.directory / "returncode"
            if done.exists():
                self.returncode = int(done.read_text())
            elif ended:
                self.returncode = -signal.SIGKILL
            elif pid is None and self._parent.poll() is not None:
                log = _parent_log(self._planner).read_text()[-2000:]
                raise RuntimeError(
                    f"the warm parent (workers/zygote_worker.py) ended with {self._parent.returncode}: {log}"
                )
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL its leader and ranks, waiting up to `KILL_WAIT_SECONDS` for the warm parent to
        have started the leader."""
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while self.pid is None and self._parent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.pid is not None:
            kill_tree(self.pid)
        else:
            self.returncode = -signal.SIGKILL  # not started: the session ends, and its parent with it


def warm_launch(
    script: Path, nproc: int, *args: str, cwd: Path = ROOT, timeout: int = 600
) -> subprocess.CompletedProcess:
    """``torchrun(script, nproc, *args)`` with each rank forked from a parent that has imported
    torch and the project already: the same environment, output and exit code (1 when a rank
    failed; the others are stopped as torchrun's agent stops them), without four imports of
    torch a launch. For scripts that test what a launch does, not torchrun itself: restarts,
    torchrun's own messages and interpreter exit need ``torchrun``."""
    directory = Path(tempfile.mkdtemp(prefix="warm-launch-"))
    launch = WarmLaunch(script, nproc, *args, directory=directory, cwd=cwd)
    try:
        code = launch.wait(timeout)
    except subprocess.TimeoutExpired:
        launch.kill()
        raise subprocess.TimeoutExpired(launch.args, timeout, *_outputs(directory)) from None
    out, err = _outputs(directory)
    shutil.rmtree(directory, ignore_errors=True)
    return subprocess.CompletedProcess(launch.args, code, out, err)


def _outputs(directory: Path) -> tuple[str, str]:
    return tuple(
        (directory / name).read_text(errors="replace") if (directory / name).exists() else ""
        for name in ("stdout", "stderr")
    )
