"""Whether the ranks of a dry run meet in the same collectives: a real run blocks in a
collective until every rank of its group has issued it, so a collective that only some ranks
issue (one under ``if rank == 0:``) hangs the job, or pairs with another collective and
corrupts it. The fake process group completes every collective at once, so a dry run of one
rank cannot see it; running more ranks and comparing what each issued can.

- `CollectiveLog` records, for one rank's whole run (not only the steps the memory tracker
  follows), each collective it issues: the kind, the group's ranks, the dtype and the script's
  line.
- `first_mismatch` compares the logs of the ranks run: for each group two of them share, both
  must issue the same kinds, in the same order, on the same dtypes, as many times. A group is
  its process group, not its ranks: the world and a ``new_group`` of every rank are two
  communicators. Point-to-point ``send``/``recv`` pair different calls by design and are left
  out.
- `comparison_ranks` picks the ranks a one-rank dry run also runs to compare with: for each group
  the rank issued collectives on, its last other member (``--ranks all`` compares every rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

import torch

from spmd._util.ranks import rank_ranges
from spmd._util.torch_compat import TorchDispatchMode
from spmd.inspector._dtensor.collectives import _first_dtype, collective_call, group_of, is_collective
from spmd.inspector._dtensor.placeholders import user_line

__all__ = ["CollectiveLog", "Issued", "comparison_ranks", "first_mismatch", "twin_ranks"]

_POINT_TO_POINT = ("send", "recv")


@dataclass(frozen=True)
class Issued:
    """One collective a rank issued.

    Attributes:
        op: its kind (``all-reduce``, ``barrier``...).
        ranks: its group's global ranks.
        dtype: its input's dtype ('' for a barrier).
        line: the script's line it was issued under (``train.py:42``), or ''.
        group: its process group's name ('' if unknown). Two groups over the same ranks (the
            world and a ``new_group`` of every rank) are two communicators: their collectives
            never meet.
    """

    op: str
    ranks: tuple[int, ...]
    dtype: str
    line: str
    group: str = ""

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        """What identifies its group: the name, then the ranks."""
        return (self.group, self.ranks)

    def on(self, twins: bool) -> str:
        """Its group in words: by its ranks, and by its name too when ``twins`` (another group
        of the logs has the same ranks)."""
        if twins and self.group:
            return f"process group {self.group} (ranks {rank_ranges(self.ranks)})"
        return f"the group of ranks {rank_ranges(self.ranks)}"

    def describe(self) -> str:
        where = f" at {self.line}" if self.line else ""
        dtype = f" of {self.dtype}" if self.dtype else ""
        return f"{self.op}{dtype}{where}"


class CollectiveLog(TorchDispatchMode):
    """Records every collective the rank issues inside it (``issued``, in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.issued: list[Issued] = []
        self._groups: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per group (`deadlock`)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = func(*args, **(kwargs or {}))
        if func.namespace == "c10d" and func._schema.name.split("::")[-1] == "barrier":
            ranks, group = group_of({"process_group": next(a for a in args if isinstance(a, torch.ScriptObject))})
            self.issued.append(Issued("barrier", self._group(ranks), "", user_line(), group))
        elif is_collective(func):
            call = collective_call(func, args, kwargs or {}, result, position=0, phase="", module="")
            if call.op not in _POINT_TO_POINT:  # a scatter's or broadcast's other ranks give no input: their output's
                dtype = call.dtype or _first_dtype(list(args))
                self.issued.append(Issued(call.op, self._group(call.ranks), dtype, user_line(), call.group))
        return result

    def _group(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        return self._groups.setdefault(ranks, ranks)


def twin_ranks(logs: dict[int, Sequence[Issued]]) -> set[tuple[int, ...]]:
    """The rank sets over which the logs hold more than one process group."""
    names: dict[tuple[int, ...], set[str]] = {}
    for issued in logs.values():
        for i in issued:
            names.setdefault(i.ranks, set()).add(i.group)
    return {ranks for ranks, n in names.items() if len(n) > 1}


def _on_group(issued: Sequence[Issued], key: tuple[str, tuple[int, ...]]) -> list[Issued]:
    return [i for i in issued if i.key == key]


def _mismatch_on(on: str, ranks: tuple[int, int], logs: tuple[list[Issued], list[Issued]]) -> str:
    """How the two ranks' collectives on the group ``on`` (in words) first differ ('' if they do
    not): a collective one issues and the other does not, or a different one at the same place."""
    (r, s), (mine, theirs) = ranks, logs
    matcher = SequenceMatcher(None, [(i.op, i.dtype) for i in mine], [(i.op, i.dtype) for i in theirs], autojunk=False)
    for tag, i, _, j, _ in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "delete":
            return f"rank {r} issues {mine[i].describe()} on {on} (its collective #{i} there), which rank {s} does not issue"
        if tag == "insert":
            return f"rank {s} issues {theirs[j].describe()} on {on} (its collective #{j} there), which rank {r} does not issue"
        return f"on {on}, collective #{i} is {mine[i].describe()} on rank {r} but {theirs[j].describe()} on rank {s}"
    return ""


def first_mismatch(logs: dict[int, Sequence[Issued]]) -> str:
    """The first difference between ranks in the collectives of groups they share, as a
    message naming the ranks, the collective, the script's line and the fix; '' if none.
    ``logs``: each rank's collectives, in issue order."""
    ranks = sorted(logs)
    twins = twin_ranks(logs)
    for i, r in enumerate(ranks):
        for s in ranks[i + 1 :]:
            shared = {c.key: c for c in [*logs[r], *logs[s]] if r in c.ranks and s in c.ranks}
            for key, example in shared.items():
                on = example.on(example.ranks in twins)
                found = _mismatch_on(on, (r, s), (_on_group(logs[r], key), _on_group(logs[s], key)))
                if found:
                    return (
                        f"the ranks would not meet in the same collectives: {found}. A real run blocks in a "
                        "collective until every rank of its group issues it, so this job hangs there (or pairs "
                        "different collectives). Issue collectives on every rank of the group, outside code that "
                        "runs on some ranks only (if rank == 0: ...)."
                    )
    return ""


def comparison_ranks(rank: int, world: int, issued: Sequence[Issued]) -> list[int]:
    """The ranks to run beside ``rank`` so that each group it issued collectives on has other
    members run: the one after ``rank`` and the last (``if rank == 0``, ``== 1``, ``== world - 1``
    are the usual branches); with no collectives, those of the whole world."""
    groups = list(dict.fromkeys(i.ranks for i in issued)) or [tuple(range(world))]
    chosen: set[int] = set()
    for group in groups:
        others = [g for g in group if g != rank]
        if others:
            after = [g for g in others if g > rank]
            chosen.update({(after or others)[0], others[-1]})
    return sorted(chosen)
