"""Child processes the test session runs beside its tests: started early (when collection ends,
or the first time a test asks), awaited by the tests that read what they wrote.

A test that reads a module-level run says so with ``@pytest.mark.reads(RUN)``; when collection
ends, tests/conftest.py `queue`s the runs the selected tests read and orders those tests after
the rest. The queue runs its runs one at a time in each of two lines: the planner's compiles
(tests/spmd/plan/child_compile.py) at nice 19, so the tests in the foreground keep the CPU, and
the multi-process launches that mostly wait (`torchrun_in_background`: timeouts, restarts,
process exits) at the tests' own priority, since what they check includes how long a rank takes
to fail. A test whose run has not started yet starts it, so a module run on its own works the
same. The planner worker's processes (plan_results.py) and torchft's chaos runs
(tests/fsdp_xla/chaos_runs.py) are started at once rather than queued. `stop_all` ends every run
still going when the session ends.

The compile line: a thread of the session starts each run the moment the one before it ends
(advanced only between tests, the queue stood still through every test of a minute or more).
Two compiles at a time all along took no less (the tests leave little idle, 2 to 3 % of the
suite's CPU), but while a test waits for a run the session uses no CPU: then two run at once.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.torchrun import ROOT, WarmLaunch, child_env, kill_tree, launch_env, torchrun_arguments

# `nice` execs the command (the same pid), where a preexec_fn would run Python between fork and
# exec in a session that has jax's threads.
NICE = ("nice", "-n", "19")
# In a run's arguments, stands for the run's own directory (made when it starts): where a launch
# writes its records, read back through `BackgroundRun.directory`.
OWN_DIR = "{own_dir}"
# How often the queue's thread looks for an ended run: short beside a run of 5 s or more.
POLL_SECONDS = 0.25


class BackgroundRun:
    """``python PROGRAM... [CONFIG] ARGS...``, where CONFIG is the model ``config`` written to a
    JSON file (none when ``config`` is None); `completed` is how it ended, `result` the JSON of the
    last line it printed. ``nice``: at nice 19, below the tests in the foreground. ``env``: the
    run's environment (`child_env(xla=False)` when None). ``warm``: forked from the warm parent
    that has imported the planner (tests/torchrun.py, `WarmLaunch`) instead of a fresh
    interpreter, with that parent's environment (``env`` unused); for a ``("-c", CODE)`` or a
    ``(SCRIPT,)`` program. With its 10 compile runs forked so, the current lane's nice-19 CPU fell
    from 575 to 463 core-s (one run each, 2026-12-02; this machine's runs vary by about 10 %)."""

    def __init__(
        self, program: tuple[str, ...], config: dict | None, *args: str, timeout: float, nice: bool = True,
        env: dict[str, str] | None = None, warm: bool = False,
    ) -> None:  # fmt: skip
        if warm and not (program[0] == "-c" or (len(program) == 1 and program[0].endswith(".py"))):
            raise ValueError(f"a warm run is a ('-c', CODE) or (SCRIPT,) program, not {program[:1]}")
        self.program, self.config, self.args, self.timeout, self.nice = program, config, args, timeout, nice
        self.env, self.warm = env, warm
        self._proc: subprocess.Popen | WarmLaunch | None = None
        self._dir: Path | None = None

    def start(self) -> None:
        with lock:  # a queue's thread and a test that wants this result may both start it
            if self._proc is None:
                self._start()

    def _start(self) -> None:
        _started.append(self)  # so stop_all ends it and removes its files
        self._dir = Path(tempfile.mkdtemp(prefix="test-child-"))
        config = []
        if self.config is not None:
            config = [str(self._dir / "config.json")]
            Path(config[0]).write_text(json.dumps(self.config))
        command = [arg.replace(OWN_DIR, str(self._dir)) for arg in (*self.program, *config, *self.args)]
        if self.warm:  # code as a script, CONFIG and ARGS its arguments, as ``python -c`` gives them
            script, args = Path(command[0]), command[1:]
            if command[0] == "-c":
                script, args = self._dir / "run.py", command[2:]
                script.write_text(command[1])
            self._proc = WarmLaunch(script, 1, *args, directory=self._dir, nice=19 if self.nice else 0, planner=True)
            return
        nice = NICE if self.nice else ()
        env = child_env(xla=False) if self.env is None else self.env
        with open(self._dir / "stdout", "w") as out, open(self._dir / "stderr", "w") as err:
            self._proc = subprocess.Popen([*nice, sys.executable, *command], cwd=ROOT, env=env, stdout=out, stderr=err)

    @property
    def directory(self) -> Path:
        """The run's own directory (`OWN_DIR` in its arguments); it starts the run if need be."""
        self.start()
        assert self._dir is not None
        return self._dir

    def started(self) -> bool:
        return self._proc is not None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def completed(self) -> subprocess.CompletedProcess:
        self.start()
        assert self._proc is not None and self._dir is not None
        with lock:
            _waiting[0] += 1
        try:
            code = self._proc.wait(timeout=self.timeout)
        finally:
            with lock:
                _waiting[0] -= 1
        out, err = ((self._dir / name).read_text() for name in ("stdout", "stderr"))
        return subprocess.CompletedProcess(self._proc.args, code, out, err)

    def succeeded(self) -> subprocess.CompletedProcess:
        """`completed`, or a RuntimeError with the end of what the run printed when it failed."""
        done = self.completed()
        if done.returncode != 0:
            named = " ".join(a if len(a) <= 80 else f"{a[:60]}..." for a in (*self.program, *self.args))
            said = (done.stdout[-3000:] + done.stderr[-3000:]).strip()
            raise RuntimeError(f"{named} failed ({done.returncode}):\n{said}")
        return done

    def result(self) -> Any:
        return json.loads(self.succeeded().stdout.splitlines()[-1])

    def stop(self) -> None:
        """End it and whatever it started (a chaos run's torchrun groups), and remove its files."""
        if self.running():
            if isinstance(self._proc, WarmLaunch):
                self._proc.kill()
            else:
                kill_tree(self._proc.pid)
            self._proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


def torchrun_in_background(
    script: Path, nproc: int, *args: str, max_restarts: int = 0, timeout: float = 600
) -> BackgroundRun:
    """``tests.torchrun.torchrun(script, nproc, *args)`` as a run of the queue's launch line (the
    tests' own priority); `BackgroundRun.completed` is how it ended."""
    program = torchrun_arguments(script, nproc, *args, max_restarts=max_restarts)
    return BackgroundRun(tuple(program), None, timeout=timeout, nice=False, env=launch_env())


_started: list[BackgroundRun] = []  # every run this session started
_waiting = [0]  # how many threads wait in `BackgroundRun.completed` (the session's one test, at most)
_queue: list[BackgroundRun] = []  # the runs that take turns, in their two lines (nice or not)
_stopping = threading.Event()
_watcher: list[threading.Thread] = []  # the queue's thread, while it runs
lock = threading.RLock()  # guards _started, _waiting, _queue and each run's start


def runs_read_by(item) -> list[BackgroundRun]:
    """The runs the test ``item`` reads (its ``reads`` marks)."""
    return [run for mark in item.iter_markers("reads") for run in mark.args]


def queue(runs: list[BackgroundRun]) -> None:
    """Run ``runs`` one after another in their line, each once: a thread starts the next when
    the one before it ends (`advance`)."""
    with lock:
        _queue.extend(run for run in dict.fromkeys(runs) if run not in _queue)
        advance()
        if not (_watcher and _watcher[0].is_alive()) and _queue:
            _stopping.clear()
            _watcher[:] = [threading.Thread(target=_advance_until_all_started, name="run-queue", daemon=True)]
            _watcher[0].start()


def advance() -> None:
    """In each line, start the next queued run when none of that line is running; in the compile
    line, two at a time while a test waits for a run (at the end of the session, where one
    compile at a time used one core of two and left the other idle)."""
    with lock:
        for nice in (True, False):
            line = [run for run in _queue if run.nice == nice]
            slots = 2 if nice and _waiting[0] > 0 else 1
            free = slots - sum(run.running() for run in line)
            for run in [run for run in line if not run.started()][: max(free, 0)]:
                run.start()


def _advance_until_all_started() -> None:
    while not _stopping.wait(POLL_SECONDS):
        advance()
        with lock:
            if all(run.started() for run in _queue):
                return


def stop_all() -> None:
    """Stop the queue, end every run still going (queued or started on its own), and remove
    their files."""
    _stopping.set()
    for watcher in _watcher:
        watcher.join()
    _watcher.clear()
    with lock:
        for run in _started:
            run.stop()
        _started.clear()
        _queue.clear()
