"""`watch_collectives`: a collective that failed on a stopped, hung or dead rank, told clearly.

Inside ``with watch_collectives("step 12"):`` a collective that the process group itself timed
out raises `CollectiveTimeoutError` instead, naming:

- the collective: the last one torch's flight recorder holds for this rank (its kind, sequence
  number, group and ranks, tensor sizes);
- the ranks: the heartbeats (`spmd.multiprocess`) are read twice, ``probe`` apart; a rank whose
  counter did not move is stopped, hung in native code with its threads, or dead; a rank whose
  counter moves under another label is alive elsewhere (it never reached the collective).

With NCCL, torch's own watchdog ends the process on a timeout (``TORCH_NCCL_ASYNC_ERROR_HANDLING``)
and its message names the collective; the heartbeat cannot report there.

Only the process group's own timeout is translated; every other error (a lost peer, a
DataLoader worker's or the user's own "timed out") passes through unchanged. Measured on gloo
(torch 2.9 and 2.15): a collective that times out raises a plain ``RuntimeError`` whose text is
gloo's source location then ``Timed out waiting 3000ms for recv operation to complete``, and the
flight recorder's last entry is that collective (state ``scheduled``).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

from spmd._util import torch_compat
from spmd.errors import CollectiveTimeoutError, SpmdTypeError
from spmd.multiprocess._process_group import Heartbeat, heartbeat

__all__ = ["watch_collectives", "is_collective_failure", "describe_collective", "silent_ranks"]

# What the process group itself raises when a collective waited too long: gloo's timeout, from
# its transport, with gloo's source location first (torch 2.9 and 2.15); NCCL's watchdog (torch's
# own text, as a DistBackendError). A "timed out" anywhere else is not a collective's.
_GLOO_TIMEOUT = re.compile(r"^\[[^\]]*gloo/[^\]]*\] Timed out waiting \d+ms for \w+ operation to complete")
_NCCL_TIMEOUT = "Watchdog caught collective operation timeout"


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is the process group's own collective timeout (gloo's or NCCL's), not
    any other error whose text says "timed out"."""
    if type(error) is RuntimeError:
        return _GLOO_TIMEOUT.match(str(error)) is not None
    from torch.distributed import DistBackendError

    return isinstance(error, DistBackendError) and _NCCL_TIMEOUT in str(error)


def describe_collective(record: dict[str, Any] | None) -> tuple[str, str | None]:
    """The last collective of a flight record in words, and its group's name ('an unknown
    collective' and ``None`` without a record)."""
    if not record:
        return "an unknown collective (torch's flight recorder is off: start with spmd.init_process_group)", None
    entry = record["entries"][-1]
    name, desc = (list(entry.get("process_group") or ("?", "?")) + ["?"])[:2]
    ranks = torch_compat.group_ranks(name) or "?"
    kind = str(entry.get("profiling_name", "?")).split(":")[-1]
    text = (
        f"{kind} #{entry.get('collective_seq_id', '?')} on group {desc or name!r} (ranks {ranks}), input sizes "
        f"{entry.get('input_sizes', '?')}"
    )
    return text, name


def silent_ranks(beat: Heartbeat, group: str | None) -> dict[int, str]:
    """``{rank: what is wrong with it}``: ranks whose heartbeat stopped (stopped, hung with
    all their threads, or dead) or never came, and live ranks of ``group`` that have issued
    fewer collectives on it than the others (stalled before the collective)."""
    first = beat.read()
    time.sleep(beat.timeouts.probe.total_seconds())
    second = beat.read()
    out = {}
    for rank in range(beat.world):
        if rank not in second:
            out[rank] = "never sent a heartbeat"
        elif rank != beat.rank and rank in first and first[rank].count == second[rank].count:
            out[rank] = f"its heartbeat stopped (last at {second[rank].label!r})"
    members = [r for r in (torch_compat.group_ranks(group) or []) if r in second] if group else []
    issued = {r: second[r].issued.get(group, -1) for r in members}
    for rank, n in issued.items():
        if rank not in out and n < max(issued.values()):
            out[rank] = (
                f"alive at {second[rank].label!r} but has not reached it (it issued {n} collectives on the group, "
                f"the others {max(issued.values())})"
            )
    return out


def _message(label: str, error: BaseException, beat: Heartbeat | None) -> str:
    collective, group = describe_collective(torch_compat.flight_record())
    head = f"{label}: {collective} did not complete"
    if beat is None:
        return f"{head} ({error}). Start torch.distributed with spmd.init_process_group to learn which rank stopped."
    rank = beat.rank
    parts = [f"rank {r}: {why}" for r, why in sorted(silent_ranks(beat, group).items())]
    who = "; ".join(parts) or "every rank is alive and has reached it (a slow rank, or a collective its peers skipped)"
    total = (beat.timeouts.collective + beat.timeouts.probe).total_seconds()
    return (
        f"{head} within the timeout ({total:g} s) on rank {rank}: {who}. torch.distributed said: {error}. The job "
        "cannot continue; under torchrun --max-restarts it is started again from the last checkpoint."
    )


@contextlib.contextmanager
def watch_collectives(label: str) -> Iterator[None]:
    """Label this rank's work (heartbeats carry it) and turn a collective that timed out inside
    the block into a `CollectiveTimeoutError` naming the collective and the ranks that did not
    answer. Only the process group's own timeout is turned; any other error passes through
    unchanged.

    Raises:
        CollectiveTimeoutError: the process group timed out a collective in the block.
    """
    if not isinstance(label, str):  # watch_collectives(60) reads as a timeout, which it is not
        raise SpmdTypeError(
            f"watch_collectives takes a label (a str naming the work, e.g. 'step 12'), got {label!r:.60}; the "
            "timeout is spmd.init_process_group's timeout=."
        )
    beat = heartbeat()
    if beat is not None:
        beat.label = label
    try:
        yield
    except RuntimeError as e:  # the label stays: the others' reports see this rank where it failed
        if not is_collective_failure(e):
            raise
        raise CollectiveTimeoutError(_message(label, e, beat)) from e
    if beat is not None:  # between blocks a rank is "after" its last one, for the others' reports
        beat.label = f"after {label}"
