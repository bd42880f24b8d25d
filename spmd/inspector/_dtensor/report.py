"""The dry runs of one script, gathered into the inspector's one `Report` (its ``ranks``): the
ranks run, the one with the highest peak, its warnings, why a run stopped early, and whether
the ranks run (those reported and those run only to compare) issue the same collectives."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from spmd.inspector._dtensor.agreement import first_mismatch
from spmd.inspector._dtensor.deadlock import coverage, order_deadlock
from spmd.inspector._dtensor.record import StepRecord
from spmd.inspector._dtensor.run import RankRun
from spmd.inspector.checks import dry_run_issues
from spmd.inspector.report import Finding, Report, WarningCode

__all__ = ["DryRunReport", "PLATFORM"]

PLATFORM = "fake process group (dry run)"
"""The report's ``platform`` for a dry run."""

# What a real run's steps are held to (tests/workers/dryrun_real_worker.py writes the same).
_step_dict = StepRecord.to_dict


@dataclass(frozen=True)
class DryRunReport:
    """The dry runs of one script: one `RankRun` per rank inspected; ``ignore``: warning codes
    left out (`WarningCode` values); ``compared``: runs of other ranks made only to compare their
    collectives with (not reported). ``report`` is their `Report`, whose attributes
    (``table()``, ``to_dict()``, ``write_json()``) can be read from here directly, as from
    `Capture`."""

    script: str
    world: int
    runs: tuple[RankRun, ...]
    ignore: frozenset[str] = frozenset()
    compared: tuple[RankRun, ...] = ()

    @property
    def partial(self) -> str:
        """Why a run stopped early ('' if none did)."""
        for run in self.runs + self.compared:
            if run.failure:
                where = f" at {run.failing_line}" if run.failing_line else ""
                return f"rank {run.rank}: {run.failure}{where}"
        return ""

    @cached_property  # the replay and comparison are linear and quadratic in the ranks: once
    def mismatch(self) -> str:
        """How the ranks run first differ in the collectives of a group they share ('' if they
        do not, or a run stopped early: its collectives end there)."""
        if self.partial:
            return ""
        return first_mismatch(self._logs())

    @cached_property
    def deadlock(self) -> str:
        """How the ranks run, whose collectives match group by group, would still block each
        other for good in a real run (issuing two groups' collectives in different orders); ''
        if they would not, or the groups do not match (`mismatch` says why), or a run stopped
        early."""
        if self.partial or self.mismatch:
            return ""
        return order_deadlock(self._logs())

    def _logs(self) -> dict[int, tuple]:
        """Each rank run's collectives, in issue order."""
        return {r.rank: r.issued for r in self.runs + self.compared}

    def agreement_note(self) -> str:
        """What the comparison of collectives covered, for a run that found no mismatch."""
        ranks = sorted({r.rank for r in self.runs + self.compared})
        if self.world == 1:
            return ""
        if len(ranks) == 1:
            return f"collectives: rank {ranks[0]} alone was run; no other rank was compared with it."
        same = (
            f"collectives: ranks {', '.join(map(str, ranks))} issue the same collectives on every group they share"
            + coverage(self._logs(), self.world)
        )
        if len(ranks) == self.world:
            return same + " (every rank of the job compared)."
        return same + f"; the other ranks were not run (--ranks all runs and compares all {self.world})."

    def worst(self) -> RankRun:
        """The run with the highest peak (the lowest rank among equal peaks)."""
        return max(self.runs, key=lambda r: (r.peak_bytes, -r.rank))

    def warnings(self) -> list[Finding]:
        """Uneven (padded) shards with their cost, and the placeholders the script read, for the
        run with the highest peak (`spmd.inspector.checks.dry_run_issues`)."""
        found = list(dry_run_issues(self.worst(), self.ignore))
        if self.mismatch:  # an error: never left out
            found.insert(0, Finding(WarningCode.UNMATCHED_COLLECTIVES, "", self.mismatch))
        if self.deadlock:  # an error too
            found.insert(0, Finding(WarningCode.COLLECTIVE_ORDER_DEADLOCK, "", self.deadlock))
        return found

    @property
    def report(self) -> Report:
        """The inspector's report of these runs."""
        return Report(
            warnings=tuple(self.warnings()),
            devices=self.world,
            platform=PLATFORM,
            partial=self.partial,
            ranks=self.runs,
            script=self.script,
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.report, name)
