"""The inspector's report: per compiled graph, memory, parameters and collectives; warnings.

Values only (frozen dataclasses); building them from dump files lives in `spmd.inspector.dump`,
warnings in `spmd.inspector.checks`. A report prints as a table and saves as JSON.
"""

from __future__ import annotations

import enum
import json
import math
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mesh._checks import is_int, is_real, require_int
from spmd._util.atomic_file import atomic_write, file_to_write
from spmd.hlo import ArrayShape
from spmd.inspector.collectives import Collective, CollectiveKind
from spmd.inspector.memory import MemoryUsage

__all__ = ["ParameterInfo", "GraphReport", "WarningCode", "Finding", "Report", "UnknownGraphError", "format_bytes"]


def format_bytes(n: int | float) -> str:
    """``1536`` -> ``'1.50 KiB'``.

    Raises:
        TypeError: ``n`` is not a number.
    """
    if not is_real(n):
        raise TypeError(f"format_bytes takes a number of bytes, got {type(n).__name__} {n!r:.60}.")
    value = float(n)
    if not math.isfinite(value):
        return f"{value} B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class UnknownGraphError(KeyError):
    """`Report.graph` found no graph by that name or position (a KeyError whose text reads plainly)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class ParameterInfo:
    """One argument of a compiled graph (a weight, optimizer state, an input batch...).

    Attributes:
        number: the entry parameter number.
        shape: the per-device (partitioned) shape.
        global_shape: the unpartitioned shape, when the pre-partitioning HLO was dumped.
        sharding: the HLO sharding text (``{replicated}``, ``{devices=[8,1]...}``).
        name: the tensor's name when it could be told (module path + parameter name), else ''.
    """

    number: int
    shape: ArrayShape
    global_shape: ArrayShape | None
    sharding: str
    name: str = ""

    @property
    def nbytes(self) -> int:
        """Bytes on each device."""
        return self.shape.nbytes

    @property
    def global_nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return (self.global_shape or self.shape).nbytes

    @property
    def label(self) -> str:
        """``'blocks.0.attn.qkv.weight (parameter 3)'`` or ``'parameter 3'``."""
        return f"{self.name} (parameter {self.number})" if self.name else f"parameter {self.number}"


@dataclass(frozen=True)
class GraphReport:
    """What one compiled graph costs each device.

    Attributes:
        name: XLA's module name, e.g. ``SyncTensorsGraph.412``.
        module_id: the dump's module number (compile order within the process).
        num_partitions: devices the graph runs on.
        memory: per-device memory from XLA's buffer assignment; ``None`` if the backend did
            not write one.
        parameters: the graph's arguments, by parameter number.
        collectives: the collectives in schedule order.
        hlo_path: the partitioned, optimized HLO text file.
        step: the step (count of ``torch_xla.sync()`` calls before it) that compiled it.
    """

    name: str
    module_id: int
    num_partitions: int
    memory: MemoryUsage | None
    parameters: tuple[ParameterInfo, ...]
    collectives: tuple[Collective, ...]
    hlo_path: str
    step: int | None = None

    @property
    def argument_bytes(self) -> int:
        """Bytes of all arguments on each device (from the partitioned parameter shapes)."""
        return sum(p.nbytes for p in self.parameters)

    @property
    def bytes_sent_per_device(self) -> int:
        """Ring-algorithm bytes each device sends in this graph, all collectives together."""
        return sum(c.bytes_sent_per_device for c in self.collectives)

    def count(self, kind: CollectiveKind) -> int:
        """How many collectives of ``kind`` the graph runs."""
        return sum(1 for c in self.collectives if c.kind is kind)

    def parameter(self, number: int) -> ParameterInfo | None:
        """The argument with parameter number ``number``."""
        return next((p for p in self.parameters if p.number == number), None)


class WarningCode(enum.Enum):
    """Kinds of findings; pass their values to ``ignore`` to silence one kind."""

    REPLICATED_ARGUMENT = "replicated-argument"
    REPLICATED_ACTIVATION = "replicated-activation"
    PARAMETER_ALL_GATHER = "parameter-all-gather"
    RECOMPILATION = "recompilation"
    UNEVEN_SHARD = "uneven-shard"
    DATA_DEPENDENT = "data-dependent-call"


@dataclass(frozen=True)
class Finding:
    """A warning about the sharding, with what to change."""

    code: WarningCode
    graph: str
    message: str

    def __str__(self) -> str:
        where = f"[{self.graph}] " if self.graph else ""
        return f"{self.code.value}: {where}{self.message}"


@dataclass(frozen=True)
class Report:
    """The inspector's findings for one captured step or one script run.

    Attributes:
        graphs: each compiled graph, in compile order.
        warnings: the findings that were not ignored.
        devices: the number of devices.
        platform: the PJRT device type (``CPU``, ``TPU``).
        steps: graphs compiled per step, ``{step: (module ids...)}``; a step ends at each
            ``torch_xla.sync()``.
        dump_dir: where XLA wrote its dumps.
        partial: why the run stopped early (the script raised), or ``""`` for a complete run.
    """

    graphs: tuple[GraphReport, ...]
    warnings: tuple[Finding, ...] = ()
    devices: int = 0
    platform: str = ""
    steps: dict[int, tuple[int, ...]] = field(default_factory=dict)
    dump_dir: str = ""
    partial: str = ""

    # Totals -------------------------------------------------------------------------------
    @property
    def peak_bytes(self) -> int:
        """The largest per-device peak over the graphs (they run one after the other)."""
        return max((g.memory.peak_bytes for g in self.graphs if g.memory), default=0)

    @property
    def bytes_sent_per_device(self) -> int:
        """Ring-algorithm bytes each device sends over all graphs."""
        return sum(g.bytes_sent_per_device for g in self.graphs)

    def step_graphs(self, step: int) -> tuple[GraphReport, ...]:
        """The graphs compiled in ``step``."""
        ids = set(self.steps.get(step, ()))
        return tuple(g for g in self.graphs if g.module_id in ids)

    def step_totals(self) -> list[dict[str, Any]]:
        """Per step: its graphs, collectives, bytes sent and peak, per device."""
        out = []
        for step in sorted(self.steps):
            graphs = self.step_graphs(step)
            out.append(
                {
                    "step": step,
                    "graphs": [g.name for g in graphs],
                    "collectives": dict(sorted(Counter(c.kind.value for g in graphs for c in g.collectives).items())),
                    "bytes_sent_per_device": sum(g.bytes_sent_per_device for g in graphs),
                    "peak_bytes_per_device": max((g.memory.peak_bytes for g in graphs if g.memory), default=0),
                }
            )
        return out

    def collective_counts(self) -> dict[str, int]:
        """``{'all-gather': 12, ...}`` over all graphs."""
        counts = Counter(c.kind.value for g in self.graphs for c in g.collectives)
        return dict(sorted(counts.items()))

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
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (bytes as ints); the DTensor lane's dry run writes the same keys."""
        return {
            "tool": "spmd.inspector",
            "lane": "torch_xla",
            "partial": self.partial or None,
            "devices": self.devices,
            "platform": self.platform,
            "graphs": [self._graph_dict(g) for g in self.graphs],
            "ranks": [],  # one program for every device; the DTensor lane's dry run lists ranks here
            "steps": self.step_totals(),
            "totals": {
                "graphs": len(self.graphs),
                "peak_bytes_per_device": self.peak_bytes,
                "bytes_sent_per_device": self.bytes_sent_per_device,
                "collectives": self.collective_counts(),
            },
            "warnings": [{"code": w.code.value, "graph": w.graph, "message": w.message} for w in self.warnings],
        }

    def _graph_dict(self, g: GraphReport) -> dict[str, Any]:
        memory = g.memory
        return {
            "name": g.name,
            "module_id": g.module_id,
            "step": g.step,
            "num_partitions": g.num_partitions,
            "memory_per_device": None
            if memory is None
            else {
                "peak_bytes": memory.peak_bytes,
                "argument_bytes": memory.argument_bytes,
                "output_bytes": memory.output_bytes,
                "alias_bytes": memory.alias_bytes,
                "temp_bytes": memory.temp_bytes,
            },
            "argument_bytes_per_device": g.argument_bytes,
            "parameters": [
                {
                    "number": p.number,
                    "name": p.name,
                    "shape": str(p.shape),
                    "global_shape": None if p.global_shape is None else str(p.global_shape),
                    "sharding": p.sharding,
                    "bytes_per_device": p.nbytes,
                }
                for p in g.parameters
            ],
            "collectives": [self._collective_dict(g, c) for c in g.collectives],
            "totals": {
                "collectives": dict(sorted(Counter(c.kind.value for c in g.collectives).items())),
                "bytes_sent_per_device": g.bytes_sent_per_device,
            },
            "hlo_file": g.hlo_path,
        }

    def _collective_dict(self, g: GraphReport, c: Collective) -> dict[str, Any]:
        return {
            "op": c.kind.value,
            "name": c.name,
            "shape": c.shape,
            "dtype": sorted({a.dtype for a in c.arrays}),
            "result_bytes": c.result_bytes,
            "group_size": c.group_size,
            "num_groups": c.num_groups,
            "dimensions": list(c.dimensions),
            "bytes_sent_per_device": c.bytes_sent_per_device,
            "op_type": c.op_type,
            "op_name": c.op_name,
            "source": c.source,
            "source_parameter": c.source_parameter,
            "scope": c.scope,
            "source_tensor": self._source_tensor(g, c),
        }

    @staticmethod
    def _source_tensor(graph: GraphReport, c: Collective) -> str:
        """The parameter the collective moves, if its input is one, else ''."""
        if c.source_parameter is not None:
            p = graph.parameter(c.source_parameter)
            if p is not None:
                return p.label
        return ""

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
        collectives per graph (the largest)."""
        require_int(max_collectives, "max_collectives", ValueError, minimum=0, allowed="a whole number >= 0")
        lines = [f"spmd.inspector: {len(self.graphs)} compiled graph(s) on {self.devices} {self.platform} devices"]
        if self.partial:
            lines.append(f"PARTIAL REPORT: {self.partial}; the graphs compiled before that are below.")
        for g in self.graphs:
            step = f", step {g.step}" if g.step is not None else ""
            lines.append("")
            lines.append(f"== {g.name} (module {g.module_id}{step}) ==")
            if g.memory is not None:
                m = g.memory
                lines.append(
                    f"  per-device peak {format_bytes(m.peak_bytes)} = arguments {format_bytes(m.argument_bytes)}"
                    f" + outputs {format_bytes(m.output_bytes)} + temporaries {format_bytes(m.temp_bytes)}"
                )
            else:
                lines.append("  per-device peak: not reported by this backend (no buffer assignment dump)")
            lines.append(
                f"  arguments per device: {format_bytes(g.argument_bytes)} in {len(g.parameters)} parameter(s)"
            )
            if not g.collectives:
                lines.append("  collectives: none")
                continue
            lines.append(
                f"  collectives: {len(g.collectives)}, each device sends {format_bytes(g.bytes_sent_per_device)}"
                + (f"; the {max_collectives} largest:" if len(g.collectives) > max_collectives else ":")
            )
            header = f"    {'op':<19}{'shape':<26}{'group':>6}{'sent/device':>14}  source"
            lines.append(header)
            largest = sorted(g.collectives, key=lambda c: (-c.bytes_sent_per_device, c.position))
            for c in largest[:max_collectives]:
                lines.append(
                    f"    {c.kind.value:<19}{c.shape:<26}{c.group_size:>6}"
                    f"{format_bytes(c.bytes_sent_per_device):>14}  {self._source_tensor(g, c) or c.where}"
                )
            if len(g.collectives) > max_collectives:
                lines.append(f"    ... {len(g.collectives) - max_collectives} more (see the JSON)")
        lines.append("")
        for t in self.step_totals():
            counts = ", ".join(f"{n} {k}" for k, n in t["collectives"].items()) or "no collectives"
            lines.append(
                f"step {t['step']}: {len(t['graphs'])} graph(s), peak {format_bytes(t['peak_bytes_per_device'])} "
                f"per device; {counts}; {format_bytes(t['bytes_sent_per_device'])} sent per device"
            )
        for w in self.warnings:
            lines.append(f"warning {w}")
        return "\n".join(lines)
