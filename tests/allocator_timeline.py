"""What the CPU allocator held, moment by moment, in a real gloo run: read from the profiler's
memory events, with gloo's own staging buffers counted apart. The dry-run tests hold the dry
peak to it.

Two things the events alone get wrong (measured on 4 gloo ranks, bare ``fully_shard``, 2 steps):

- **Frees on gloo's threads.** The profiler reports an allocation or a free only on a thread it
  follows. Gloo's worker threads are followed while they run a collective (the work carries the
  caller's thread-local state), not when they drop the work afterwards; when that drop releases
  the last reference (a reduce-scatter's staging copy), no event says so and a sum of the
  events holds the buffer to the end of the run: 132,864 B (+15 % to +19 %) on 1 or 2 of 8
  rank-steps. c10's CPU allocator counts every thread's allocations and frees once its
  ``FLAGS_caffe2_report_cpu_memory_usage`` is set (`count_every_thread`), and each event carries
  that count (``total_allocated``): the timeline is read from the count, not summed.
- **Gloo's staging.** Gloo copies through buffers NCCL does not make: an all-gather allocates
  an output-sized buffer on the calling thread (freed before the op returns) and another on its
  worker thread (freed when the collective ends); a reduce-scatter clones its whole input,
  all-reduces the clone and keeps it until the work is released. They are allocated inside a
  ``c10d::`` op or a ``gloo:`` work, where a dispatcher-level tracker (and a dry run) never
  sees them; they are counted as the backend's staging and the peak is given with and without.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PROBE_BYTES", "Event", "StepPeak", "count_every_thread", "events_of", "step_peaks"]

PROBE_BYTES = 64
"""A storage allocated (and freed) at each step boundary: its event carries the allocator's
count at that moment (a mark itself carries none)."""

_BACKEND_SCOPES = ("c10d::", "gloo:")


def count_every_thread() -> None:
    """Make c10's CPU allocator count allocations and frees on every thread, not only on the
    threads the profiler follows (its events then carry the true count)."""
    import torch

    c10 = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    ctypes.c_bool.in_dll(c10, "FLAGS_caffe2_report_cpu_memory_usage").value = True


@dataclass(frozen=True)
class Event:
    """One allocator event in time order.

    Attributes:
        size: bytes allocated (negative: freed); 0 for a step boundary.
        ptr: the block's address.
        count: what the allocator held after it, every thread counted.
        staging: allocated inside a ``c10d::`` op or a ``gloo:`` work (the backend's own buffer).
        mark: a step boundary (the first one: where the recorder started).
    """

    size: int
    ptr: int
    count: int
    staging: bool = False
    mark: bool = False


@dataclass(frozen=True)
class StepPeak:
    """The allocator over one step, counted from what the recorder held when it started.

    Attributes:
        allocator_peak_bytes: the most the allocator held at once.
        staging_at_peak_bytes: gloo's staging buffers among it, at that moment.
        peak_without_staging_bytes: the most it held at once, gloo's staging left out.
        released_by_gloo_at_peak_bytes: at that peak (without staging), the blocks that a gloo
            worker thread frees later: tensors a collective used, whose last reference gloo's
            worker held (it keeps the work until its loop comes round, after the collective
            completed); the dry run frees them when the last user does.
        staging_max_bytes: the most gloo's staging held at once.
    """

    allocator_peak_bytes: int
    staging_at_peak_bytes: int
    peak_without_staging_bytes: int
    released_by_gloo_at_peak_bytes: int
    staging_max_bytes: int


def _raw_events(prof, mark: str) -> list[tuple[int, int, int | None, int, int, bool]]:
    """(time, thread, size or None for a mark, ptr, count, staging) for every allocator event
    and mark in the profile, in time order."""
    from torch._C._profiler import _EventType

    found, todo = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        event = todo.pop()
        todo.extend(event.children)
        if event.tag == _EventType.Allocation:
            fields, scopes, parent = event.extra_fields, [], event.parent
            while parent is not None:
                scopes.append(parent.name)
                parent = parent.parent
            staging = any(s.startswith(_BACKEND_SCOPES) for s in scopes)
            found.append(
                (event.start_time_ns, event.start_tid, fields.alloc_size, fields.ptr, fields.total_allocated, staging)
            )
        elif event.name == mark:
            found.append((event.start_time_ns, event.start_tid, None, 0, 0, False))
    return sorted(found, key=lambda item: item[0])


def events_of(prof, mark: str) -> list[Event]:
    """The profile's allocator events in time order; each ``mark`` (a ``record_function`` that
    allocates a `PROBE_BYTES` storage) becomes a boundary, placed at its probe and carrying the
    count the probe read. The probe's own allocation and free are left out."""
    raw = _raw_events(prof, mark)
    probes, freed = set(), set()
    for i, (_, thread, size, _, _, _) in enumerate(raw):
        if size is None:
            probe = next(j for j in range(i + 1, len(raw)) if raw[j][1] == thread and raw[j][2] == PROBE_BYTES)
            probes.add(probe)
            ptr = raw[probe][3]
            freed.add(
                next((j for j in range(probe + 1, len(raw)) if raw[j][3] == ptr and raw[j][2] == -PROBE_BYTES), -1)
            )
    out = []
    for i, (_, _, size, ptr, count, staging) in enumerate(raw):
        if i in probes:
            out.append(Event(0, 0, count - PROBE_BYTES, mark=True))
        elif size is not None and i not in freed:
            out.append(Event(size, ptr, count, staging))
    return out


def _unreported_frees(events: list[Event]) -> set[int]:
    """Indices of the allocations whose free no event reports: the same address is allocated
    again first, or the run ends with it still held."""
    held: dict[int, int] = {}
    unreported = set()
    for i, event in enumerate(events):
        if event.size > 0:
            if event.ptr in held:
                unreported.add(held[event.ptr])
            held[event.ptr] = i
        elif event.size < 0:
            held.pop(event.ptr, None)
    return unreported | set(held.values())


class _Blocks:
    """The blocks held now, by the index of their allocation. A block whose free no event
    reports is released where the allocator's count shows a free nobody reported, or when its
    address is allocated again; ``released`` collects those."""

    def __init__(self, unreported: set[int], freed_unreported: set[int] | None = None) -> None:
        self.held: dict[int, Event] = {}
        self.at: dict[int, int] = {}  # address -> index
        self.unreported = unreported
        self.released: set[int] = set()
        self.freed_unreported = freed_unreported or set()  # from a first walk

    def allocated(self, index: int, event: Event) -> None:
        if event.ptr in self.at:  # its earlier block was freed unreported before the address came back
            self.released.add(self.at[event.ptr])
            self.held.pop(self.at.pop(event.ptr), None)
        self.held[index], self.at[event.ptr] = event, index

    def freed(self, event: Event) -> None:
        if event.ptr in self.at:
            self.held.pop(self.at.pop(event.ptr), None)

    def release_unreported(self, nbytes: int) -> None:
        """``nbytes`` were freed where no event reported it: release the blocks whose free is
        never reported, one of exactly that size first (gloo's staging before others), else the
        largest that fit."""
        waiting = sorted(
            (i for i in self.held if i in self.unreported),
            key=lambda i: (self.held[i].size != nbytes, not self.held[i].staging, -self.held[i].size),
        )
        for i in waiting:
            if 0 < self.held[i].size <= nbytes:
                nbytes -= self.held[i].size
                self.released.add(i)
                self.freed(self.held[i])

    @property
    def staging(self) -> int:
        """Bytes of gloo's staging buffers held now."""
        return sum(e.size for e in self.held.values() if e.staging)

    @property
    def released_by_gloo(self) -> int:
        """Bytes held now, not gloo's staging, that a thread no event follows (gloo's worker,
        which holds a collective's tensors until it drops the work) frees later."""
        return sum(e.size for i, e in self.held.items() if not e.staging and i in self.freed_unreported)


@dataclass
class _Step:
    peak: int
    staging_at_peak: int = 0
    without: int = 0
    released_at_without: int = 0
    staging_max: int = 0

    def note(self, count: int, blocks: _Blocks) -> None:
        staging = blocks.staging
        if count > self.peak:
            self.peak, self.staging_at_peak = count, staging
        if count - staging > self.without:
            self.without, self.released_at_without = count - staging, blocks.released_by_gloo
        self.staging_max = max(self.staging_max, staging)

    def result(self, start: int, held_at_start: int) -> StepPeak:
        lift = held_at_start - start  # counted from what the recorder held when it started
        return StepPeak(
            self.peak + lift, self.staging_at_peak, self.without + lift, self.released_at_without, self.staging_max
        )


def step_peaks(events: list[Event], held_at_start: int, steps: int) -> list[StepPeak]:
    """Per step (between boundaries), the allocator's peak with and without gloo's staging,
    counted from ``held_at_start`` at the first boundary; a last step the script ended inside
    is closed at the end of the events."""
    unreported = _unreported_frees(events)
    first = _Blocks(unreported)
    _walk(events, first, None)
    done: list[StepPeak] = []
    last = _walk(
        events, _Blocks(unreported, first.released), lambda step, start: done.append(step.result(start, held_at_start))
    )
    if last is not None and len(done) < steps:
        done.append(last[0].result(last[1], held_at_start))
    return done[:steps]


def _walk(events: list[Event], blocks: _Blocks, close: Callable[[_Step, int], None] | None) -> tuple[_Step, int] | None:
    """Walk the events, ``close(step, start count)`` at each boundary after the first; returns
    the step open at the end (and the start count), if any."""
    start, step, before = None, None, 0
    for i, event in enumerate(events):
        unreported = before + event.size - event.count  # freed on a thread no event follows
        before = event.count
        if unreported > 0:
            blocks.release_unreported(unreported)
        if event.mark:
            if step is not None and close is not None:
                close(step, start)
            start = event.count if start is None else start
            step = _Step(event.count)
        elif event.size > 0:
            blocks.allocated(i, event)
        else:
            blocks.freed(event)
        if step is not None:
            step.note(event.count, blocks)
    return None if step is None else (step, start)
