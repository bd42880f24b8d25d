"""Child processes the test session runs beside its tests: started early (when collection ends,
or the first time a test asks), awaited by the tests that read what they wrote.

The planner's compiles (tests/spmd/plan/child_compile.py, plan_results.py) run at nice 19, so the
tests in the foreground keep the CPU; the chaos runs of torchft's healing
(tests/fsdp_xla/chaos_runs.py) run at the tests' own priority, since what they check includes
how long a heal takes. `stop_all` ends every run still going when the session ends.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.torchrun import ROOT, child_env, kill_tree

# `nice` execs the command (the same pid), where a preexec_fn would run Python between fork and
# exec in a session that has jax's threads.
NICE = ("nice", "-n", "19")


class BackgroundRun:
    """``python PROGRAM... [CONFIG] ARGS...``, where CONFIG is the model ``config`` written to a
    JSON file (none when ``config`` is None); `completed` is how it ended, `result` the JSON of the
    last line it printed. ``nice``: at nice 19, below the tests in the foreground."""

    def __init__(
        self, program: tuple[str, ...], config: dict | None, *args: str, timeout: float, nice: bool = True
    ) -> None:
        self.program, self.config, self.args, self.timeout, self.nice = program, config, args, timeout, nice
        self._proc: subprocess.Popen | None = None
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
        nice = NICE if self.nice else ()
        with open(self._dir / "stdout", "w") as out, open(self._dir / "stderr", "w") as err:
            self._proc = subprocess.Popen(
                [*nice, sys.executable, *self.program, *config, *self.args], cwd=ROOT, env=child_env(xla=False),
                stdout=out, stderr=err,
            )  # fmt: skip

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
            kill_tree(self._proc.pid)
            self._proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


_started: list[BackgroundRun] = []  # every run this session started
_waiting = [0]  # how many threads wait in `BackgroundRun.completed` (the session's one test, at most)
lock = threading.RLock()  # guards _started, _waiting, each run's start, and a queue's list (child_compile)


def session_waits() -> bool:
    """Whether a test is waiting for a run to end: the session itself then uses no CPU."""
    with lock:
        return _waiting[0] > 0


def stop_all() -> None:
    """End every run still going, and remove their files."""
    with lock:
        for run in _started:
            run.stop()
        _started.clear()
