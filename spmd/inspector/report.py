"""The inspector's report, one for both backends: what a captured step costs each device, with
warnings; a table, and JSON in one schema.

torch_xla's capture fills ``graphs`` (each compiled program, `GraphReport`); the dry run on
DTensor fills ``ranks`` (each rank it ran as, `spmd.inspector._dtensor.run.RankRun`). The rest
is common, and so is the JSON (`Report.to_dict`): the keys ``tool``, ``backend``, ``partial``,
``devices``, ``platform``, ``graphs``, ``ranks``, ``steps``, ``totals``, ``warnings``, where
each backend leaves the other's list empty, and ``steps`` holds the same `StepTotals` on both.
``lane`` is the old name of ``backend`` (the same value), kept for readers of older reports.

Values only (frozen dataclasses): the captures build them (`spmd.inspector.capture`, the dry
run), warnings come from `spmd.inspector.checks`.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mesh.checks import is_int, require_int
from spmd._util.atomic_file import atomic_write, file_to_write
from spmd._util.memory import format_bytes
from spmd.inspector._xla.graphs import GraphReport, ParameterInfo

if TYPE_CHECKING:
    from spmd.inspector._dtensor.run import RankRun

__all__ = [
    "ParameterInfo",
    "GraphReport",
    "WarningCode",
    "Finding",
    "StepTotals",
    "Report",
    "UnknownGraphError",
    "format_bytes",
]


class UnknownGraphError(KeyError):
    """`Report.graph` found no graph by that name or position (a KeyError whose text reads plainly)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class WarningCode(enum.Enum):
    """Kinds of findings; pass their values to ``ignore`` to silence one kind."""

    REPLICATED_ARGUMENT = "replicated-argument"
    REPLICATED_ACTIVATION = "replicated-activation"
    PARAMETER_ALL_GATHER = "parameter-all-gather"
    RECOMPILATION = "recompilation"
    UNEVEN_SHARD = "uneven-shard"
    DATA_DEPENDENT = "data-dependent-call"
    COMPILED_EAGERLY = "compiled-eagerly"
    UNMATCHED_COLLECTIVES = "unmatched-collectives"
    """An error, not a warning: ranks of a dry run issue different collectives (a real run hangs);
    it fails the run and cannot be ignored."""
    COLLECTIVE_ORDER_DEADLOCK = "collective-order-deadlock"
    """An error, not a warning: ranks of a dry run issue two groups' collectives in orders that
    block each other (a real run hangs); it fails the run and cannot be ignored."""


@dataclass(frozen=True)
class Finding:
    """A warning about the sharding, with what to change (either backend).

    Attributes:
        code: its kind.
        graph: the graph(s) it is about (torch_xla), or ''.
        message: what was found and what to change.
    """

    code: WarningCode
    graph: str
    message: str

    def __str__(self) -> str:
        where = f"[{self.graph}] " if self.graph else ""
        return f"{self.code.value}: {where}{self.message}"

    def to_dict(self) -> dict[str, str]:
        """Its entry in the report's JSON ``warnings``."""
        return {"code": self.code.value, "graph": self.graph, "message": self.message}

    def __getitem__(self, key: str) -> str:
        """A field of its JSON entry: ``finding["code"]`` is the code's value (the dry run's
        warnings were these dicts before they were findings)."""
        return self.to_dict()[key]


@dataclass(frozen=True)
class StepTotals:
    """One step of a captured run, per device, on either backend: an entry of the JSON ``steps``.

    Attributes:
        step: the step's number (0 first).
        graphs: the graphs compiled in it (torch_xla; none in a dry run).
        collectives: how many of each kind (``{'all-gather': 12, ...}``).
        bytes_sent_per_device: ring-algorithm bytes a device sends in the step.
        peak_bytes_per_device: the step's peak.
    """

    step: int
    graphs: tuple[str, ...]
    collectives: dict[str, int]
    bytes_sent_per_device: int
    peak_bytes_per_device: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "graphs": list(self.graphs),
            "collectives": dict(sorted(self.collectives.items())),
            "bytes_sent_per_device": self.bytes_sent_per_device,
            "peak_bytes_per_device": self.peak_bytes_per_device,
        }


@dataclass(frozen=True)
class Report:
    """The inspector's findings for one captured step or one script run, on either backend.

    Attributes:
        graphs: torch_xla: each compiled graph, in compile order.
        warnings: the findings that were not ignored.
        devices: the number of devices (a dry run: the ranks of the job).
        platform: the PJRT device type (``CPU``, ``TPU``), or the dry run's fake process group.
        steps: torch_xla: graphs compiled per step, ``{step: (module ids...)}``; a step ends at
            each ``torch_xla.sync()``.
        dump_dir: torch_xla: where XLA wrote its dumps.
        partial: why the run stopped early (the script raised), or ``""`` for a complete run.
        ranks: the dry run: each rank it ran as (`spmd.inspector._dtensor.run.RankRun`).
        script: the dry run: the script it ran.
    """

    graphs: tuple[GraphReport, ...] = ()
    warnings: tuple[Finding, ...] = ()
    devices: int = 0
    platform: str = ""
    steps: dict[int, tuple[int, ...]] = field(default_factory=dict)
    dump_dir: str = ""
    partial: str = ""
    ranks: tuple[RankRun, ...] = ()
    script: str = ""

    @property
    def backend(self) -> str:
        """``'dtensor'`` for a dry run, else ``'torch_xla'``."""
        return "dtensor" if self.ranks else "torch_xla"

    @property
    def lane(self) -> str:
        """The old name of `backend` (deprecated)."""
        warnings.warn(
            "Report.lane is deprecated: use Report.backend (the same value).", DeprecationWarning, stacklevel=2
        )
        return self.backend

    # Totals -------------------------------------------------------------------------------
    @property
    def peak_bytes(self) -> int:
        """The largest per-device peak over the graphs (they run one after the other), or over
        the ranks of a dry run."""
        peaks = [g.memory.peak_bytes for g in self.graphs if g.memory] + [r.peak_bytes for r in self.ranks]
        return max(peaks, default=0)

    @property
    def bytes_sent_per_device(self) -> int:
        """Ring-algorithm bytes each device sends over all graphs (a dry run: over the steps of
        the rank with the highest peak)."""
        if self.ranks:
            return sum(t.bytes_sent_per_device for t in self.step_records())
        return sum(g.bytes_sent_per_device for g in self.graphs)

    def step_graphs(self, step: int) -> tuple[GraphReport, ...]:
        """The graphs compiled in ``step``."""
        ids = set(self.steps.get(step, ()))
        return tuple(g for g in self.graphs if g.module_id in ids)

    def step_records(self) -> tuple[StepTotals, ...]:
        """Per step: its graphs, collectives, bytes sent and peak, per device (a dry run: the
        steps of the rank with the highest peak)."""
        if self.ranks:
            return self.worst_rank().step_totals()
        out = []
        for step in sorted(self.steps):
            graphs = self.step_graphs(step)
            out.append(
                StepTotals(
                    step,
                    tuple(g.name for g in graphs),
                    dict(Counter(c.kind.value for g in graphs for c in g.collectives)),
                    sum(g.bytes_sent_per_device for g in graphs),
                    max((g.memory.peak_bytes for g in graphs if g.memory), default=0),
                )
            )
        return tuple(out)

    def step_totals(self) -> list[dict[str, Any]]:
        """`step_records` as the JSON's ``steps`` entries."""
        return [t.to_dict() for t in self.step_records()]

    def collective_counts(self) -> dict[str, int]:
        """``{'all-gather': 12, ...}`` over all graphs (a dry run: over its steps)."""
        if self.ranks:
            counts = sum((Counter(t.collectives) for t in self.step_records()), Counter())
        else:
            counts = Counter(c.kind.value for g in self.graphs for c in g.collectives)
        return dict(sorted(counts.items()))

    def worst_rank(self) -> RankRun:
        """A dry run: the rank with the highest peak (the lowest such rank).

        Raises:
            ValueError: the report has no ranks (it is torch_xla's).
        """
        if not self.ranks:
            raise ValueError("worst_rank() is for a dry run's report; this one has compiled graphs, no ranks.")
        return max(self.ranks, key=lambda r: (r.peak_bytes, -r.rank))

    def graph(self, name_or_index: str | int = -1) -> GraphReport:
        """A graph by module name or position (default: the last compiled, the steady step).

        Raises:
            UnknownGraphError: no graph has that name or position.
        """
        names = [g.name for g in self.graphs][:20]
        if is_int(name_or_index):
            if -len(self.graphs) <= name_or_index < len(self.graphs):
                return self.graphs[name_or_index]
            raise UnknownGraphError(
                f"No graph at position {name_or_index}; the report has {len(self.graphs)}: {names}."
            )
        for g in self.graphs:
            if g.name == name_or_index:
                return g
        raise UnknownGraphError(f"No graph named {name_or_index!r:.80}; graphs: {names}.")

    # JSON ---------------------------------------------------------------------------------
    def _totals(self) -> dict[str, Any]:
        if self.ranks:  # the steady step's cost: the largest step of the worst rank
            sent = max((t.bytes_sent_per_device for t in self.step_records()), default=0)
            return {
                "graphs": 0,
                "peak_bytes_per_device": self.worst_rank().peak_bytes,
                "bytes_sent_per_device": sent,
                "collectives": self.collective_counts(),
            }
        return {
            "graphs": len(self.graphs),
            "peak_bytes_per_device": self.peak_bytes,
            "bytes_sent_per_device": self.bytes_sent_per_device,
            "collectives": self.collective_counts(),
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (bytes as ints), the same keys on both backends (module docstring)."""
        return {
            "tool": "spmd.inspector",
            "backend": self.backend,
            "lane": self.backend,  # the old key, kept for older readers
            "partial": self.partial or None,
            "devices": self.devices,
            "platform": self.platform,
            "graphs": [g.to_dict() for g in self.graphs],
            "ranks": [r.to_dict() for r in self.ranks],
            "steps": self.step_totals(),
            "totals": self._totals(),
            "warnings": [w.to_dict() for w in self.warnings],
        }

    def write_json(self, path: str | os.PathLike[str], *, save_hlo: bool = True) -> Path:
        """Write the JSON report atomically; with ``save_hlo``, copy each graph's optimized HLO
        text into ``<path stem>.hlo/`` beside it (the JSON then points there).

        Returns:
            The JSON path.

        Raises:
            TypeError: ``path`` is not a path.
            ValueError: ``path`` (or its ``.hlo`` folder) is a directory (a file) or cannot be
                made; nothing is written then.
        """
        target = file_to_write(path, "write_json")
        hlo_dir = target.with_name(target.stem + ".hlo")
        save_hlo = save_hlo and bool(self.graphs)  # a dry run compiles nothing
        if save_hlo and hlo_dir.exists() and not hlo_dir.is_dir():
            raise ValueError(
                f"write_json: {hlo_dir} (where the HLO files go) is a file; move it or pass save_hlo=False."
            )
        data = self.to_dict()
        if save_hlo:
            hlo_dir.mkdir(exist_ok=True)
            for g, entry in zip(self.graphs, data["graphs"]):
                if g.hlo_path and Path(g.hlo_path).exists():
                    dest = hlo_dir / Path(g.hlo_path).name
                    shutil.copyfile(g.hlo_path, dest)
                    entry["hlo_file"] = str(dest)
        with atomic_write(target) as tmp:
            tmp.write_text(json.dumps(data, indent=2) + "\n")
        return target

    # Table --------------------------------------------------------------------------------
    def table(self, max_collectives: int = 20) -> str:
        """The report as a plain-text table (what the CLI prints), with at most ``max_collectives``
        collectives per graph (the largest) or per rank's step (the first)."""
        require_int(max_collectives, "max_collectives", ValueError, minimum=0, allowed="a whole number >= 0")
        if self.ranks:
            ranks = ", ".join(str(r.rank) for r in self.ranks)
            lines = [
                f"spmd.inspector: dry run of {self.script} as rank(s) {ranks} of {self.devices} (fake process group)"
            ]
            before = "the steps before it are below"
        else:
            lines = [f"spmd.inspector: {len(self.graphs)} compiled graph(s) on {self.devices} {self.platform} devices"]
            before = "the graphs compiled before that are below"
        if self.partial:
            lines.append(f"PARTIAL REPORT: {self.partial}; {before}.")
        for g in self.graphs:
            lines += g.table_lines(max_collectives)
        for r in self.ranks:
            lines += r.table_lines(max_collectives)
        if not self.ranks:
            lines.append("")
            lines += [_step_line(t) for t in self.step_records()]
        lines += [f"warning {w}" for w in self.warnings]
        return "\n".join(lines)


def _step_line(t: StepTotals) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in sorted(t.collectives.items())) or "no collectives"
    return (
        f"step {t.step}: {len(t.graphs)} graph(s), peak {format_bytes(t.peak_bytes_per_device)} "
        f"per device; {counts}; {format_bytes(t.bytes_sent_per_device)} sent per device"
    )
