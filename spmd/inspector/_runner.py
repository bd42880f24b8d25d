"""Run a training script as ``python SCRIPT ARGS`` would: as ``__main__``, with its own argv and
its folder first on ``sys.path``, inside what a capture wraps around it; and say how it ended.

Both captures run scripts through here (torch_xla's under `capture`, the dry run's in its fake
world), so a script stops, fails and exits the same way on both backends:

- a capture ends the script early by raising `StopScript` in it (after ``--steps`` steps);
- ``sys.exit(0)`` is a finished script; ``sys.exit(n)`` its failure, and the CLI exits with
  ``n``; an exception its failure with exit code 1, at the script's own line;
- the capture sees the exception or exit leave its ``with`` block (to mark its report
  partial); an error of the capture itself (nothing to report) is not the script's and
  propagates;
- ``os._exit(n)`` in the script's thread ends the script there (`ScriptExited`), not the
  inspector's process: the report shows what ran before it, and the CLI exits with ``n``, or 1
  for ``os._exit(0)`` (a real process ends at once, skipping ``finally`` blocks, ``atexit``
  handlers and buffered writes: the run did not end as a script's run ends). From another
  thread it ends the process, as it would, after saying so on stderr, with code ``n`` or 2;
- a thread of the script that dies with an exception fails the run (exit 1, the thread's
  exception and line), even when the script's own thread ends well: Python only prints it.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import traceback
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spmd.inspector.report import Report

__all__ = ["Outcome", "ScriptEnd", "ScriptExited", "StopScript", "run_script", "script_line"]

_LIBRARY_PARTS = ("/torch/", "/site-packages/", "/spmd/", "/fsdp_xla/", "/mesh/", "/importlib/", "<frozen")


class StopScript(BaseException):
    """Raised inside the script to end it after the steps asked for; a BaseException so the
    script's own ``except Exception`` blocks do not swallow it."""


class ScriptExited(BaseException):
    """Raised in the script's thread in place of ``os._exit(code)``, which would end the
    inspector's process before it reports; a BaseException, like ``SystemExit``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class ScriptEnd:
    """How a script run ended.

    Attributes:
        exit_code: 0 when it finished (or was stopped after its steps), ``n`` for
            ``sys.exit(n)`` (1 when ``n`` is not a number), 1 when it raised.
        failure: what went wrong in one line (``KeyError: 'late'``, ``the script exited with
            code 3``), or '' when nothing did.
        line: the script's line that raised (``train.py:42``), or ''.
        traceback: the exception's traceback, or ''.
    """

    exit_code: int = 0
    failure: str = ""
    line: str = ""
    traceback: str = ""

    def describe(self) -> str:
        """``KeyError: 'late' at train.py:42``."""
        return f"{self.failure} at {self.line}" if self.line else self.failure


@dataclass(frozen=True)
class Outcome:
    """What a capture hands the CLI (`spmd.inspector.cli`), which prints it the same way for
    both backends: the table, the JSON, the failure, and exits with ``exit_code``.

    Attributes:
        report: the report, or None when there is nothing to report.
        exit_code: 0, the script's (`ScriptEnd.exit_code`), or 2 when the inspector could not
            run it.
        failure: what went wrong, in one line ('' if nothing did).
        traceback: the script's traceback when it raised, or ''.
        notes: lines printed last (where XLA's dumps were kept).
    """

    report: Report | None
    exit_code: int = 0
    failure: str = ""
    traceback: str = ""
    notes: tuple[str, ...] = ()


def is_user_file(path: str) -> bool:
    """Whether ``path`` is the script's own code (not torch's, not ours, not the standard library)."""
    path = path.replace("\\", "/")
    return not any(part in path for part in _LIBRARY_PARTS) and not path.startswith((sys.prefix, sys.base_prefix))


def script_line(frames: Sequence[traceback.FrameSummary]) -> str:
    """``'train.py:42'``: the innermost of ``frames`` in the script's own code, or ''."""
    for summary in reversed(frames):
        if is_user_file(summary.filename):
            return f"{summary.filename}:{summary.lineno}"
    return ""


def _ended_by(error: BaseException) -> ScriptEnd:
    if isinstance(error, ScriptExited):
        line = script_line(traceback.extract_tb(error.__traceback__))
        return ScriptEnd(
            error.code or 1,
            f"os._exit({error.code}) ended the script (a real run's process ends there at once, skipping finally "
            "blocks, atexit handlers and unflushed writes: the dry run stopped it there and reports what ran before; "
            "return, or sys.exit, to end a run well)",
            line,
        )
    if isinstance(error, SystemExit):
        if isinstance(error.code, int):
            return ScriptEnd(error.code, f"the script exited with code {error.code}")
        return ScriptEnd(1, f"the script exited with the message {error.code!r:.200} (exit code 1)")
    if isinstance(error, SyntaxError) and not _from_script_frames(error):  # the script's file does not compile
        where = f"{error.filename}:{error.lineno}" if error.filename and error.lineno else ""
        detail = "".join(traceback.format_exception_only(type(error), error))
        return ScriptEnd(1, f"the script does not compile: {type(error).__name__}: {error.msg}", where, detail)
    text = f"{type(error).__name__}: {error}".strip().rstrip(":")
    frames = traceback.extract_tb(error.__traceback__)
    first = text.splitlines()[0] if text else type(error).__name__
    return ScriptEnd(
        1, first, script_line(frames), "".join(traceback.format_exception(type(error), error, _from_script(error)))
    )


def _from_script_frames(error: BaseException) -> bool:
    """Whether any frame of ``error``'s traceback is the script's own code."""
    return any(is_user_file(f.filename) for f in traceback.extract_tb(error.__traceback__))


def _from_script(error: BaseException) -> TracebackType | None:
    """The traceback from the script's first frame on (the runner's and runpy's left out)."""
    tb = error.__traceback__
    while tb is not None and not is_user_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb or error.__traceback__


class _Exits:
    """While the script runs: ``os._exit`` in the script's thread raises `ScriptExited` (in a
    forked child, such as a data loader's worker, it is the real one), and the exceptions that
    end the script's other threads are kept (``died``: (thread name, exception))."""

    def __init__(self) -> None:
        self.died: list[tuple[str, BaseException]] = []

    def _exit(self, code: int) -> None:
        if os.getpid() != self._pid:
            self._os_exit(code)
        if threading.get_ident() == self._thread:
            raise ScriptExited(code)
        where = script_line(traceback.extract_stack()[:-1]) or "its code"
        print(
            f"spmd.inspector: a thread of the script ({threading.current_thread().name}) called os._exit({code}) at "
            f"{where}, which ends the process with no report: the inspector cannot follow it. End that thread by "
            "returning, and the script from its main thread.",
            file=sys.stderr,
            flush=True,
        )
        self._os_exit(code or 2)

    def _thread_died(self, hook: threading.ExceptHookArgs) -> None:
        if hook.exc_value is not None and not isinstance(hook.exc_value, SystemExit):
            self.died.append((hook.thread.name if hook.thread is not None else "a thread", hook.exc_value))
        self._excepthook(hook)

    def __enter__(self) -> _Exits:
        self._pid, self._thread = os.getpid(), threading.get_ident()
        self._os_exit, self._excepthook = os._exit, threading.excepthook
        os._exit, threading.excepthook = self._exit, self._thread_died  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        os._exit, threading.excepthook = self._os_exit, self._excepthook  # type: ignore[assignment]

    def end(self) -> ScriptEnd:
        """How the script ended when its own thread ended well: a thread's death, or fine."""
        if not self.died:
            return ScriptEnd()
        name, error = self.died[0]
        end = _ended_by(error)
        return ScriptEnd(1, f"a thread of the script ({name}) died with {end.failure}", end.line, end.traceback)


def run_script(script: Path, args: Sequence[str], around: AbstractContextManager[object] | None = None) -> ScriptEnd:
    """Run ``script`` with ``args`` inside ``around``; how it ended.

    Raises:
        Exception: ``around`` itself failed (entering it, or leaving it with no error of the
            script's).
    """
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.resolve().parent))
    raised: BaseException | None = None
    exits = _Exits()
    try:
        with exits, around if around is not None else nullcontext():
            try:
                runpy.run_path(str(script), run_name="__main__")
            except StopScript:
                pass
            except SystemExit as e:
                if e.code not in (0, None):
                    raised = e
                    raise
            except (Exception, ScriptExited) as e:
                raised = e
                raise
    except (Exception, SystemExit, ScriptExited) as e:
        if e is not raised:
            raise
        return _ended_by(e)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return exits.end()
