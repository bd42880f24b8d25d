"""The dry runs of one script, gathered into the inspector's one `Report` (its ``ranks``): the
ranks run, the one with the highest peak, its warnings and why a run stopped early."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spmd.inspector._dtensor.record import StepRecord
from spmd.inspector._dtensor.run import RankRun
from spmd.inspector.checks import dry_run_issues
from spmd.inspector.report import Finding, Report

__all__ = ["DryRunReport", "PLATFORM"]

PLATFORM = "fake process group (dry run)"
"""The report's ``platform`` for a dry run."""

# What a real run's steps are held to (tests/workers/dryrun_real_worker.py writes the same).
_step_dict = StepRecord.to_dict


@dataclass(frozen=True)
class DryRunReport:
    """The dry runs of one script: one `RankRun` per rank inspected; ``ignore``: warning codes
    left out (`WarningCode` values). ``report`` is their `Report`, whose attributes (``table()``,
    ``to_dict()``, ``write_json()``) can be read from here directly, as from `Capture`."""

    script: str
    world: int
    runs: tuple[RankRun, ...]
    ignore: frozenset[str] = frozenset()

    @property
    def partial(self) -> str:
        """Why a run stopped early ('' if none did)."""
        for run in self.runs:
            if run.failure:
                where = f" at {run.failing_line}" if run.failing_line else ""
                return f"rank {run.rank}: {run.failure}{where}"
        return ""

    def worst(self) -> RankRun:
        """The run with the highest peak (the lowest rank among equal peaks)."""
        return max(self.runs, key=lambda r: (r.peak_bytes, -r.rank))

    def warnings(self) -> list[Finding]:
        """Uneven (padded) shards with their cost, and the placeholders the script read, for the
        run with the highest peak (`spmd.inspector.checks.dry_run_issues`)."""
        return list(dry_run_issues(self.worst(), self.ignore))

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
