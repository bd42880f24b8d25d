"""`SigtermHold`: torchrun's SIGTERM waits while a failed collective is diagnosed and reported.

When one rank of a torchrun job fails, the agent ends the others: SIGTERM to each worker's
process group, then SIGKILL to those still alive 30 s later (torch.distributed.elastic, 2.9 and
2.15: ``LocalElasticAgent._stop_workers`` calls ``_shutdown()`` with its default ``timeout=30``,
``SubprocessContext._close`` sends the signal with ``os.killpg``, waits, then ``SIGKILL``;
``--shutdown-timeout`` does not reach this path). Python leaves SIGTERM at its default action, so
a rank still diagnosing (reading heartbeats for ``probe`` seconds) or still blocked in the
collective ended at once, without a report: when a rank is SIGKILLed mid all_gather, its ring
neighbours see "Connection closed by peer" at once, but the rank across the ring waits on a
neighbour, and torchrun's SIGTERM came 0.1 s later (measured, torch 2.9 and 2.15).
``ProcessGroupGloo.abort()`` and ``shutdown()`` leave gloo's connections open (measured), so a
rank cannot wake its peers; it can only be spared until they close.

The hold lasts one `watch_collectives` block (main thread only: Python runs signal handlers
there) and restores the previous handler afterwards. A SIGTERM that comes while no collective
failure is on its way gets the previous disposition at once: the default still ends the process,
as before. One that comes while a collective failure propagates, or while it is diagnosed, is
held. A handler in Python runs only when the main thread runs Python again, so a rank blocked in
gloo holds the SIGTERM until the collective fails (a closed connection, or its timeout); one hung
in other native code until torchrun's SIGKILL. Once the report is raised the hold goes on for
`REPORT_GRACE` seconds (for the caller's ``except`` blocks, a log line, torchrun's error file),
then the previous handler is back and a held SIGTERM is delivered.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["REPORT_GRACE", "SigtermHold"]

REPORT_GRACE = 5.0
"""Seconds a report has after it is raised before a held SIGTERM is delivered: with a diagnosis
of at most 5 s, well inside torchrun's 30 s from SIGTERM to SIGKILL."""

_ARMED, _DIAGNOSING, _REPORTED, _DONE = "armed", "diagnosing", "reported", "done"


def _failure_in_flight(is_failure: Callable[[BaseException], bool]) -> bool:
    """Whether the exception being handled on this thread, or one it was raised from, is a
    collective failure. A handler runs only between Python instructions, and the first ones
    after a failed collective are an ``except``, ``finally`` or ``__exit__`` somewhere up the
    stack, where the exception is the one being handled."""
    error = sys.exception()
    for _ in range(8):  # a chain of re-raises; more is not a failed collective's
        if error is None:
            return False
        if is_failure(error):
            return True
        error = error.__cause__ or error.__context__
    return False


class SigtermHold:
    """Hold SIGTERM for one `watch_collectives` block while a collective failure is on its way,
    diagnosed, or just reported (see the module's docstring). Inert without ``on_end`` (no
    heartbeat: no diagnosis to wait for), off the main thread, or where a handler Python cannot
    restore (one set from C) is installed.

    ``on_end`` runs before a SIGTERM goes to the default action (the heartbeat's last beat: the
    others then read that this process ended, not that it stopped)."""

    def __init__(self, is_failure: Callable[[BaseException], bool], on_end: Callable[[], None] | None) -> None:
        self._is_failure, self._on_end = is_failure, on_end
        self._previous: Any = None
        self._state = _DONE
        self._held: int | None = None
        self._grace_over = False
        self._pid = os.getpid()

    def __enter__(self) -> SigtermHold:
        if self._on_end is None or threading.current_thread() is not threading.main_thread():
            return self
        previous = signal.getsignal(signal.SIGTERM)
        if previous is None:  # set from C: signal.signal could not put it back
            return self
        try:
            signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main interpreter
            return self
        self._previous, self._state = previous, _ARMED
        return self

    def diagnosing(self) -> None:
        """A collective failed: hold any SIGTERM until the report is out."""
        if self._state == _ARMED:
            self._state = _DIAGNOSING

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._state == _DIAGNOSING and error is not None:  # the report is on its way up
            self._state = _REPORTED
            timer = threading.Timer(REPORT_GRACE, self._end_grace)
            timer.daemon = True  # a process that ends first needs no more
            timer.start()
        elif self._state != _DONE:
            self._release(None)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._state == _ARMED and _failure_in_flight(self._is_failure):
            self._state = _DIAGNOSING
        if self._state == _DIAGNOSING or (self._state == _REPORTED and not self._grace_over):
            self._held = signum
            return
        if self._state == _ARMED:  # nothing to report: the previous disposition, now
            self._held = signum
        self._release(frame)  # armed, or the grace is over (maybe _end_grace's simulated signal)

    def _end_grace(self) -> None:
        self._grace_over = True
        if self._state != _REPORTED:
            return
        if signal.getsignal(signal.SIGTERM) == self._handle:
            # signal.signal works on the main thread only: _thread.interrupt_main runs _handle
            # there as if the signal came, and _handle puts the previous handler back.
            _thread.interrupt_main(signal.SIGTERM)
        elif self._held is not None:  # the caller installed a handler of its own meanwhile: it gets the signal
            held, self._held, self._state = self._held, None, _DONE
            os.kill(os.getpid(), held)

    def _release(self, frame: FrameType | None) -> None:
        """Put the previous handler back (unless someone replaced ours) and give it the held
        signal, if any."""
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._previous)
        held, self._held, self._state = self._held, None, _DONE
        if held is not None:  # a child forked in the block (a DataLoader worker) ends as it would have
            on_end = self._on_end if self._on_end is not None and os.getpid() == self._pid else (lambda: None)
            _deliver(held, self._previous, frame, on_end)


def _deliver(signum: int, previous: Any, frame: FrameType | None, on_end: Callable[[], None]) -> None:
    """What the previous disposition would have done with the signal."""
    if previous == signal.SIG_IGN:
        return
    if callable(previous):
        previous(signum, frame)
        return
    on_end()
    os.kill(os.getpid(), signum)  # the default action, the handler restored: the process ends here
