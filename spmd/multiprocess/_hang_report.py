"""`watch_collectives`: a collective that failed on a stopped, hung or dead rank, told clearly.

Inside ``with watch_collectives("step 12"):`` a collective that the process group itself timed
out raises `CollectiveTimeoutError` instead, and (with the heartbeat on) one that lost its
connection to a peer raises `PeerLostError`, naming:

- the collective: the last one torch's flight recorder holds for this rank (its kind, sequence
  number, group and ranks, tensor sizes);
- the ranks: the heartbeats (`spmd.multiprocess`) are read twice, ``probe`` apart; a rank whose
  last beat says its process ended exited (through Python: an exception, a normal exit, the
  SIGTERM this module held); a rank whose counter did not move is stopped, hung in native code
  with its threads, or killed (a SIGKILLed rank and a SIGSTOPped one look alike here); a rank
  whose counter moves under another label is alive elsewhere (it never reached the collective).

A lost connection is diagnosed like a timeout because it is usually the same event seen from
another rank: when gloo times a collective out, it closes every connection of that rank's group
("Application timeout caused pair closure"), and its peers still waiting read "Connection closed
by peer" before their own timeouts fire. A rank killed mid-collective is seen the same way.

With NCCL, torch's own watchdog ends the process on a timeout (``TORCH_NCCL_ASYNC_ERROR_HANDLING``)
and its message names the collective; the heartbeat cannot report there.

Only these errors are translated; every other error (a DataLoader worker's or the user's own
"timed out", a lost connection without the heartbeat) passes through unchanged. Measured on gloo
(torch 2.9 and 2.15), each a plain ``RuntimeError`` starting with gloo's source location:

- a timeout: ``Timed out waiting 3000ms for recv operation to complete``; the flight recorder's
  last entry is that collective (state ``scheduled``);
- a peer killed, exited or whose group was closed: ``Connection closed by peer [127.0.0.1]:52415``
  (2.15 adds ``. This is typically caused by a remote worker crashing. ... GLHF!``), or, with
  unread data in the dead peer's socket, ``Read error [127.0.0.1]:17083: Connection reset by
  peer``;
- a later collective on connections an earlier timeout closed: ``Application timeout caused pair
  closure`` (without a location).

Read in gloo's sources (tcp/pair.cc), not seen here: ``writev [addr]: Broken pipe`` and ``Socket
closed [addr]``; newer gloo names the peer ``rank 3 ([addr])``, a rank of the group.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from spmd._util import torch_compat
from spmd.errors import CollectiveTimeoutError, PeerLostError, SpmdTypeError
from spmd.multiprocess._process_group import Heartbeat, heartbeat
from spmd.multiprocess._sigterm import SigtermHold

__all__ = [
    "watch_collectives",
    "is_collective_failure",
    "lost_connection",
    "LostConnection",
    "describe_collective",
    "silent_ranks",
]

# What the process group itself raises when a collective waited too long: gloo's timeout, from
# its transport, with gloo's source location first (torch 2.9 and 2.15); NCCL's watchdog (torch's
# own text, as a DistBackendError). A "timed out" anywhere else is not a collective's.
_GLOO_TIMEOUT = re.compile(r"^\[[^\]]*gloo/[^\]]*\] Timed out waiting \d+ms for \w+ operation to complete")
_NCCL_TIMEOUT = "Watchdog caught collective operation timeout"

# gloo's lost connections, from its tcp transport (pair.cc), location first; the peer follows.
_GLOO_LOST = re.compile(
    r"^\[[^\]]*gloo/[^\]]*\] (?P<kind>Connection closed by peer|Read error|writev|Socket closed"
    r"|Socket unexpectedly closed) (?P<rest>.*)",
    re.DOTALL,
)
_GLOO_PEER = re.compile(r"(?:rank (?P<rank>\d+) \()?(?P<address>\[[^\]]*\]:\d+)\)?(?:: (?P<why>[^.]+))?")
_CLOSED_BY_OWN_TIMEOUT = "Application timeout caused pair closure"  # gloo gives this one no location


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is the process group's own collective timeout (gloo's or NCCL's), not
    any other error whose text says "timed out"."""
    if type(error) is RuntimeError:
        return _GLOO_TIMEOUT.match(str(error)) is not None
    from torch.distributed import DistBackendError

    return isinstance(error, DistBackendError) and _NCCL_TIMEOUT in str(error)


@dataclass(frozen=True)
class LostConnection:
    """A collective's connection to a peer, lost: how (in words), and the peer as gloo names it
    (its address; newer gloo also its rank in the group)."""

    how: str
    address: str | None = None
    group_rank: int | None = None


def lost_connection(error: BaseException) -> LostConnection | None:
    """The lost connection gloo reports in ``error``, or ``None`` when it reports none."""
    if not isinstance(error, RuntimeError) or isinstance(error, CollectiveTimeoutError):
        return None
    text = str(error)
    if text == _CLOSED_BY_OWN_TIMEOUT:
        return LostConnection(
            "closed by an earlier timeout of this rank's, which closes all of its group's connections"
        )
    match = _GLOO_LOST.match(text)
    if match is None:
        return None
    peer = _GLOO_PEER.match(match["rest"])
    address, rank, why = (peer["address"], peer["rank"], peer["why"]) if peer else (None, None, None)
    how = {
        "Connection closed by peer": "closed by the peer",
        "Socket closed": "already closed by an earlier failure",
        "Socket unexpectedly closed": "already closed by an earlier failure",
    }.get(match["kind"], (why or "failed").strip().lower())
    return LostConnection(how, address, None if rank is None else int(rank))


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
    """``{rank: what is wrong with it}``: ranks whose process ended, whose heartbeat stopped
    (stopped, hung with all their threads, or killed) or never came, and live ranks of
    ``group`` that have issued fewer collectives on it than the others (stalled before the
    collective)."""
    first = beat.read()
    time.sleep(beat.timeouts.probe.total_seconds())
    second = beat.read()
    out = {}
    for rank in range(beat.world):
        if rank not in second:
            out[rank] = "never sent a heartbeat"
        elif second[rank].ended:
            out[rank] = f"its process ended (last at {second[rank].label!r})"
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


def _who(beat: Heartbeat, group: str | None, nobody: str) -> str:
    """What the heartbeats say about the ranks, ``nobody`` when they name no rank."""
    try:
        silent = silent_ranks(beat, group)
    except RuntimeError as e:  # the store is gone or slow: the job is ending around this rank
        return f"the heartbeats could not be read ({e})"
    return "; ".join(f"rank {r}: {why}" for r, why in sorted(silent.items())) or nobody


_ENDING = "The job cannot continue; under torchrun --max-restarts it is started again from the last checkpoint."


def _timeout_message(label: str, error: BaseException, beat: Heartbeat | None) -> str:
    collective, group = describe_collective(torch_compat.flight_record())
    head = f"{label}: {collective} did not complete"
    if beat is None:
        return f"{head} ({error}). Start torch.distributed with spmd.init_process_group to learn which rank stopped."
    who = _who(beat, group, "every rank is alive and has reached it (a slow rank, or a collective its peers skipped)")
    total = (beat.timeouts.collective + beat.timeouts.probe).total_seconds()
    return (
        f"{head} within the timeout ({total:g} s) on rank {beat.rank}: {who}. torch.distributed said: {error}. "
        + _ENDING
    )


def _peer(lost: LostConnection, group: str | None) -> str:
    """The peer as gloo names it: a rank of the group (newer gloo), else its address."""
    if lost.group_rank is not None:
        ranks = torch_compat.group_ranks(group) if group else None
        rank = ranks[lost.group_rank] if ranks and lost.group_rank < len(ranks) else f"{lost.group_rank} of the group"
        return f"rank {rank}" + (f" ({lost.address})" if lost.address else "")
    return f"the peer at {lost.address}" if lost.address else "a peer"


def _lost_message(label: str, error: BaseException, lost: LostConnection, beat: Heartbeat) -> str:
    collective, group = describe_collective(torch_compat.flight_record())
    who = _who(
        beat,
        group,
        "every rank's heartbeat goes on and every rank has reached it: the peer's process did not end "
        "(it closed its process group, or the network failed)",
    )
    return (
        f"{label}: {collective} did not complete: rank {beat.rank} lost its connection to {_peer(lost, group)} "
        f"({lost.how}; no timeout passed): {who}. torch.distributed said: {error}. " + _ENDING
    )


def _is_failure(error: BaseException) -> bool:
    return is_collective_failure(error) or lost_connection(error) is not None


def _diagnosis(label: str, error: BaseException, beat: Heartbeat | None, hold: SigtermHold) -> Exception | None:
    """The error to raise for ``error``, or ``None`` when it is not a collective's failure."""
    lost = lost_connection(error) if beat is not None else None
    if lost is None and not is_collective_failure(error):
        return None
    hold.diagnosing()
    if lost is not None and beat is not None:
        return PeerLostError(_lost_message(label, error, lost, beat))
    return CollectiveTimeoutError(_timeout_message(label, error, beat))


@contextlib.contextmanager
def watch_collectives(label: str) -> Iterator[None]:
    """Label this rank's work (heartbeats carry it) and turn a collective that failed inside
    the block into an error naming the collective and the ranks that did not answer: one the
    process group timed out into a `CollectiveTimeoutError`; with the heartbeat on
    (`spmd.init_process_group`), one whose connection to a peer was lost into a
    `PeerLostError`. Any other error passes through unchanged.

    With the heartbeat on, a SIGTERM (torchrun ending the job) that comes while a collective
    failure is on its way or diagnosed waits until the report is raised, and 5 s more
    (``spmd.multiprocess._sigterm``); any other SIGTERM acts at once, as before.

    Raises:
        CollectiveTimeoutError: the process group timed out a collective in the block.
        PeerLostError: a collective in the block lost its connection to a peer.
    """
    if not isinstance(label, str) or not label.strip():  # watch_collectives(60) reads as a timeout, which it is not
        raise SpmdTypeError(
            f"watch_collectives takes a label (a non-empty str naming the work, e.g. 'step 12': the reports name "
            f"it), got {label!r:.60}; the timeout is spmd.init_process_group's timeout=."
        )
    beat = heartbeat()
    if beat is not None:
        beat.label = label
    hold = SigtermHold(_is_failure, beat.stop if beat is not None else None)
    with hold:
        try:
            yield
        except Exception as e:
            failure = _diagnosis(label, e, beat, hold) if isinstance(e, RuntimeError) else None
            if failure is not None:  # the label stays: the others' reports see this rank where it failed
                raise failure from e
            # If this ends the process, the others' reports read how; an inner block's report keeps
            # the inner label, where this rank failed.
            if beat is not None and not isinstance(e, CollectiveTimeoutError):
                beat.label = f"{label}, raising {type(e).__name__}"
            raise
    if beat is not None:  # between blocks a rank is "after" its last one, for the others' reports
        beat.label = f"after {label}"
