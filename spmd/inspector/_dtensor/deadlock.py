"""Whether the ranks of a dry run, each issuing its collectives in program order, all get to
the end of them. A real run (NCCL, gloo) completes a collective of a group only when every rank
of the group has reached it; a rank blocked there issues nothing else. Two groups' collectives
issued in different orders on different ranks can then hang the job although each group's own
sequence is the same on all its ranks (`spmd.inspector._dtensor.agreement` checks that): rank 0
waits in the world's all-reduce for rank 1, which waits in the all-reduce of the group (0, 1)
for rank 0. The order of issue counts with ``async_op=True`` too: NCCL's kernels block while
they wait for their peers, and its guide asks that operations on different communicators be
submitted in the same order on every rank. The fake process group completes every collective at
once and cannot see any of it.

- `stuck_at` replays the ranks' logs as a real job progresses and returns where each rank that
  never finishes stays blocked.
- `find_deadlock` follows, from the lowest such rank, whom each waits for: a cycle of waits (or a
  rank waiting for one that issued all its collectives).
- `order_deadlock` words it as the report's error, with the fix.

Only the ranks run are replayed: a member of a group that was not run is taken to reach each of
the group's collectives whenever the ranks run do. So a deadlock found holds whatever those ranks
do (they can only hold the ranks run back further), but a cycle of waits that passes through a
rank not run is not seen (`coverage` says so).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spmd.inspector._dtensor.agreement import Issued, twin_ranks

__all__ = ["Deadlock", "Waiting", "coverage", "find_deadlock", "order_deadlock", "stuck_at"]

# One collective of a group, as every member counts it: (the group's number, its index among
# the collectives the rank issued on that group).
_Meeting = tuple[int, int]


@dataclass(frozen=True)
class _Replay:
    """``logs`` numbered as meetings (``meetings[rank][n]``: the meeting its n-th collective
    joins; the n-th collective a rank issues on a group meets the n-th of every other member, as
    a communicator matches calls by their order), ``groups[g]``: group g's ranks, and ``stuck``:
    ``{rank: position}`` for each rank left blocked."""

    meetings: dict[int, list[_Meeting]]
    groups: list[tuple[int, ...]]
    stuck: dict[int, int]


def _number(logs: Mapping[int, Sequence[Issued]]) -> tuple[dict[int, list[_Meeting]], list[tuple[int, ...]]]:
    """Each rank's collectives as meetings, and the groups' ranks by number. A group is its
    process group (name and ranks): two groups over the same ranks never meet. Groups are looked
    up by their ranks' tuple object first: hashing a 256-rank tuple at every collective would
    cost more than the replay (a log holds the same few tuples: `CollectiveLog` interns them)."""
    numbers: dict[tuple[str, tuple[int, ...]], int] = {}
    by_object: dict[tuple[int, str], int] = {}
    meetings: dict[int, list[_Meeting]] = {}
    for rank, issued in logs.items():
        seen: dict[int, int] = defaultdict(int)
        mine = meetings[rank] = []
        for i in issued:
            group = by_object.get((id(i.ranks), i.group))
            if group is None:
                group = by_object[(id(i.ranks), i.group)] = numbers.setdefault(i.key, len(numbers))
            mine.append((group, seen[group]))
            seen[group] += 1
    return meetings, [ranks for _, ranks in numbers]


def _replay(logs: Mapping[int, Sequence[Issued]]) -> _Replay:
    meetings, groups = _number(logs)
    run = [sum(1 for m in group if m in logs) for group in groups]  # the members a meeting waits for
    position = dict.fromkeys(logs, 0)
    at: dict[_Meeting, list[int]] = defaultdict(list)
    ready: deque[_Meeting] = deque()

    def arrive(rank: int) -> None:
        if position[rank] < len(meetings[rank]):
            meeting = meetings[rank][position[rank]]
            at[meeting].append(rank)
            if len(at[meeting]) == run[meeting[0]]:
                ready.append(meeting)

    for rank in logs:
        arrive(rank)
    while ready:  # each meeting completes once: linear in the collectives issued
        for rank in at.pop(ready.popleft()):
            position[rank] += 1
            arrive(rank)
    return _Replay(meetings, groups, {r: p for r, p in position.items() if p < len(meetings[r])})


def stuck_at(logs: Mapping[int, Sequence[Issued]]) -> dict[int, int]:
    """``{rank: position in its log}`` for each rank of ``logs`` that a real job leaves blocked
    forever, at the collective it is blocked in ({} when every rank finishes). A meeting
    completes when every member of its group that is in ``logs`` has reached it: the members
    not run are assumed never to hold it back."""
    return _replay(logs).stuck


@dataclass(frozen=True)
class Waiting:
    """A rank blocked in a collective.

    Attributes:
        rank: the rank.
        collective: the collective it is blocked in.
        index: its index among the collectives the rank issued on that group.
        waits_for: the first member of the group run that has not reached it.
        twins: another group of the job has the same ranks (so the message names the group).
    """

    rank: int
    collective: Issued
    index: int
    waits_for: int
    twins: bool = False

    def describe(self) -> str:
        return (
            f"rank {self.rank} waits in {self.collective.describe()} on {self.collective.on(self.twins)} "
            f"(its collective #{self.index} there) for rank {self.waits_for}"
        )


@dataclass(frozen=True)
class Deadlock:
    """The ranks run that a real job leaves blocked.

    Attributes:
        chain: from the lowest blocked rank, each rank and whom it waits for, until the chain
            closes (``closed``: the last waits for a rank earlier in the chain) or reaches a rank
            that issued all its collectives.
        closed: whether ``chain`` ends in a cycle of waits.
        stuck: every rank run that never finishes.
    """

    chain: tuple[Waiting, ...]
    closed: bool
    stuck: tuple[int, ...]

    @property
    def cycle(self) -> tuple[Waiting, ...]:
        """The waits that form the cycle (the chain from the rank the last one waits for)."""
        if not self.closed:
            return ()
        start = next(i for i, w in enumerate(self.chain) if w.rank == self.chain[-1].waits_for)
        return self.chain[start:]


def find_deadlock(logs: Mapping[int, Sequence[Issued]]) -> Deadlock | None:
    """The ranks of ``logs`` (each rank's collectives, in issue order) a real job leaves blocked,
    and why; None when every rank gets through all its collectives."""
    replay = _replay(logs)
    stuck, meetings = replay.stuck, replay.meetings
    if not stuck:
        return None
    twins = twin_ranks(logs)

    def waiting(rank: int) -> Waiting:
        group, index = meeting = meetings[rank][stuck[rank]]
        there = {r for r in stuck if meetings[r][stuck[r]] == meeting}
        first = next(m for m in replay.groups[group] if m in logs and m not in there)
        collective = logs[rank][stuck[rank]]
        return Waiting(rank, collective, index, first, collective.ranks in twins)

    chain = [waiting(min(stuck))]
    seen = {chain[0].rank}
    while chain[-1].waits_for in stuck and chain[-1].waits_for not in seen:
        seen.add(chain[-1].waits_for)
        chain.append(waiting(chain[-1].waits_for))
    return Deadlock(tuple(chain), chain[-1].waits_for in seen, tuple(sorted(stuck)))


def order_deadlock(logs: Mapping[int, Sequence[Issued]]) -> str:
    """The deadlock of `find_deadlock` as the report's error: the ranks, the collective each is
    blocked in (op, group, the script's line) and whom it waits for, and the fix; '' if none."""
    found = find_deadlock(logs)
    if found is None:
        return ""
    if not found.closed:
        last = found.chain[-1].waits_for
        return (
            f"the ranks would deadlock: {'; '.join(w.describe() for w in found.chain)}, which has issued all its "
            f"collectives. A real run blocks in a collective until every rank of its group reaches it, and rank "
            f"{last} never does, so the job hangs there. Issue collectives on every rank of the group, outside code "
            "that runs on some ranks only."
        )
    waits = "; ".join(w.describe() for w in found.cycle)
    others = [r for r in found.stuck if r not in {w.rank for w in found.cycle}]
    also = ""
    if others:
        who = f"ranks {', '.join(map(str, others))} are" if len(others) > 1 else f"rank {others[0]} is"
        also = f" ({who} held up behind them)"
    return (
        f"the ranks would deadlock on the order of their collectives across groups: {waits}{also}. Each "
        "group's collectives match on its ranks, but a real run blocks in a collective until every rank of "
        "its group reaches it, and each of these ranks is held in one group by a rank waiting in another, so "
        "the job hangs there. Issue collectives on different groups in the same order on every rank (the "
        "same interleaving of groups everywhere, not one that depends on the rank)."
    )


def coverage(logs: Mapping[int, Sequence[Issued]], world: int) -> str:
    """What the replay of ``logs`` (no deadlock found) rules out, for the report's last line ('' when
    the ranks run issued collectives on one group: no order across groups to check). A cycle of
    waits through a rank not run cannot be seen."""
    groups = {i.key for issued in logs.values() for i in issued}
    if len(groups) < 2:
        return ""
    if len(logs) == world:
        return f", and their order across {len(groups)} groups cannot deadlock"
    return (
        f", and their order across {len(groups)} groups cannot deadlock among them; a cycle of waits through "
        "ranks not run cannot be ruled out"
    )
