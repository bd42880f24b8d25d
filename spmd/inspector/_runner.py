"""Run a training script as ``python SCRIPT ARGS`` would: as ``__main__``, with its own argv and
its folder first on ``sys.path``, inside what a capture wraps around it; and say how it ended.

Both captures run scripts through here (torch_xla's under `capture`, the dry run's in its fake
world), so a script stops, fails and exits the same way on both lanes:

- a capture ends the script early by raising `StopScript` in it (after ``--steps`` steps);
- ``sys.exit(0)`` is a finished script; ``sys.exit(n)`` its failure, and the CLI exits with
  ``n``; an exception its failure with exit code 1, at the script's own line;
- the capture sees the exception or exit leave its ``with`` block (to mark its report
  partial); an error of the capture itself (nothing to report) is not the script's and
  propagates.
"""

from __future__ import annotations

import runpy
import sys
import traceback
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spmd.inspector.report import Report

__all__ = ["Outcome", "ScriptEnd", "StopScript", "run_script", "script_line"]

_LIBRARY_PARTS = ("/torch/", "/site-packages/", "/spmd/", "/fsdp_xla/", "/mesh/", "/importlib/", "<frozen")


class StopScript(BaseException):
    """Raised inside the script to end it after the steps asked for; a BaseException so the
    script's own ``except Exception`` blocks do not swallow it."""


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
    both lanes: the table, the JSON, the failure, and exits with ``exit_code``.

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
    if isinstance(error, SystemExit):
        code = error.code if isinstance(error.code, int) else 1
        return ScriptEnd(code, f"the script exited with code {error.code}")
    text = f"{type(error).__name__}: {error}".strip().rstrip(":")
    frames = traceback.extract_tb(error.__traceback__)
    first = text.splitlines()[0] if text else type(error).__name__
    return ScriptEnd(
        1, first, script_line(frames), "".join(traceback.format_exception(type(error), error, _from_script(error)))
    )


def _from_script(error: BaseException) -> TracebackType | None:
    """The traceback from the script's first frame on (the runner's and runpy's left out)."""
    tb = error.__traceback__
    while tb is not None and not is_user_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb or error.__traceback__


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
    try:
        with around if around is not None else nullcontext():
            try:
                runpy.run_path(str(script), run_name="__main__")
            except StopScript:
                pass
            except SystemExit as e:
                if e.code not in (0, None):
                    raised = e
                    raise
            except Exception as e:
                raised = e
                raise
    except (Exception, SystemExit) as e:
        if e is not raised:
            raise
        return _ended_by(e)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return ScriptEnd()
