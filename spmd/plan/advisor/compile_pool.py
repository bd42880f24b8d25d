"""The advisor's compiles, in parallel as far as this machine allows, with progress and Ctrl-C.

Each mesh's search (`spmd.plan.advisor.search.MeshSearch`) asks for one compile at a time; the searches
of different meshes run side by side in spawned worker processes (a forked child of a process
with libtpu loaded aborts), which stay up for the whole advice so each pays jax's and torch's
imports once. A candidate in the compile cache is read here, in the main process, and never
reaches a worker: a warm advice starts no process at all. Every search ready for its next
compile reads the cache first; only then are the candidates left checked against the best plan
those reads found (`MeshSearch.withdraw_if_beaten`), so a warm advice does not compile a plan
that a cold one, whose compiles finished in another order, ruled out as unable to win.

How many workers (`default_jobs`): one per core, and no more than the memory this machine has
free allows, at `COMPILE_HOST_BYTES` each (a Llama-3.1-70B compile peaks near 2 GiB of host
memory, measured with ``/usr/bin/time -v``), keeping `RESERVE_BYTES` for everything else.

Progress goes to the log (stderr) after every plan: plans done, how many are cached, how many are
likely left (one a policy when our math is right) and at most, and the time to go at the mean
compile time so far. Ctrl-C (KeyboardInterrupt)
stops the workers (they ignore SIGINT themselves, so the main process decides) and returns what
was done, marked interrupted: the advice then ranks a partial table.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from spmd.plan.advisor.advice import Outcome
from spmd.plan.advisor.plan_cache import Settings, cached_outcome, compile_candidate
from spmd.plan.advisor.search import MeshSearch

__all__ = ["COMPILE_HOST_BYTES", "RESERVE_BYTES", "default_jobs", "run_searches"]

COMPILE_HOST_BYTES = 5 * 2**29  # 2.5 GiB a compile: a 70B one peaks near 2 GiB of host memory
RESERVE_BYTES = 2**31  # left for the main process and everything else on the machine
Log = Callable[[str], None]


def _available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (Linux), or ``None`` where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def default_jobs() -> int:
    """Workers for this machine (module docstring): at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free = _available_bytes()
    by_memory = cores if free is None else (free - RESERVE_BYTES) // COMPILE_HOST_BYTES
    return max(1, min(cores, by_memory))


@dataclass
class _Progress:
    """Plans done, cached, left, and the time left at the mean compile time so far."""

    searches: list[MeshSearch]
    jobs: int
    log: Log
    done: int = 0
    cached: int = 0
    compile_seconds: list[float] = field(default_factory=list)

    def record(self, outcome: Outcome, seconds: float | None) -> None:
        self.done += 1
        self.cached += outcome.cached
        if seconds is not None:
            self.compile_seconds.append(seconds)
        counts = [s.left() for s in self.searches]
        likely, most = sum(c[0] for c in counts), sum(c[1] for c in counts)
        line = f"[advisor: {self.done} plans done ({self.cached} cached), about {likely} left (at most {most})"
        if likely and self.compile_seconds:
            mean = sum(self.compile_seconds) / len(self.compile_seconds)
            line += f", about {_minutes(mean * likely / self.jobs)} to go"
        self.log(line + "]")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _from_cache(search: MeshSearch, settings: Settings, progress: _Progress, log: Log) -> Any:
    """The search's next candidate that is not in the cache (recording those that are), or None."""
    while (c := search.next()) is not None:
        outcome = cached_outcome(c, settings, log)
        if outcome is None:
            return c
        search.record(outcome)
        progress.record(outcome, None)
    return None


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle


def _compile_in_worker(model: Any, candidate: Any, settings: Settings) -> Outcome:
    return compile_candidate(model, candidate, settings, lambda line: print(line, file=sys.stderr, flush=True))


def _run_here(model: Any, searches: list[MeshSearch], settings: Settings, progress: _Progress, log: Log) -> None:
    for search in searches:
        while (c := _from_cache(search, settings, progress, log)) is not None:
            start = time.perf_counter()
            outcome = compile_candidate(model, c, settings, log)
            search.record(outcome)
            progress.record(outcome, time.perf_counter() - start)


def _run_in_pool(model: Any, searches: list[MeshSearch], settings: Settings, jobs: int, progress: _Progress,
                 log: Log) -> None:  # fmt: skip
    """Every search's compiles, one per search at a time, ``jobs`` at once in worker processes. A
    worker that dies (the kernel's out-of-memory killer) fails the advice with BrokenProcessPool,
    never hangs it."""
    pool: ProcessPoolExecutor | None = None
    started: dict[Future, tuple[MeshSearch, float]] = {}
    ready = list(searches)
    try:
        while ready or started:
            # Every ready search reads what it can from the cache first, then the candidates left
            # are checked against the leader those reads gave: a warm advice compiles nothing.
            pending = [(s, c) for s in ready if (c := _from_cache(s, settings, progress, log)) is not None]
            for search, c in pending:
                if search.withdraw_if_beaten():
                    continue
                if pool is None:
                    log(f"advisor: compiling in {jobs} worker processes")
                    spawn = multiprocessing.get_context("spawn")
                    pool = ProcessPoolExecutor(jobs, mp_context=spawn, initializer=_ignore_sigint)
                started[pool.submit(_compile_in_worker, model, c, settings)] = (search, time.perf_counter())
            ready = []
            if started:
                finished, _ = wait(started, timeout=0.5, return_when=FIRST_COMPLETED)  # short: Ctrl-C stays prompt
                for future in finished:
                    search, start = started.pop(future)
                    outcome = future.result()
                    search.record(outcome)
                    progress.record(outcome, time.perf_counter() - start)
                    ready.append(search)
    except BaseException:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            for child in multiprocessing.active_children():  # the compiles under way: ours, stopped now
                child.terminate()
        raise
    if pool is not None:
        pool.shutdown()


def run_searches(model: Any, searches: list[MeshSearch], settings: Settings, jobs: int, log: Log) -> bool:
    """Run every search to its end (or Ctrl-C); their outcomes are in each ``search.outcomes``.
    ``jobs`` > 1 compiles in that many worker processes (a module, which cannot be sent to one,
    compiles here). Returns whether it was interrupted."""
    progress = _Progress(searches, jobs, log)
    try:
        if jobs > 1 and isinstance(model, (str, os.PathLike)):
            _run_in_pool(model, searches, settings, jobs, progress, log)
        else:
            _run_here(model, searches, settings, progress, log)
    except KeyboardInterrupt:
        log(f"advisor: interrupted after {progress.done} plans; the table is partial")
        return True
    return False
