"""The DTensor lane's report: per rank and step, memory by category at the peak and every
collective, with ZeRO's bounds and warnings; a table and the JSON both lanes write.

The JSON has the torch_xla lane's keys (`spmd.inspector.report.Report.to_dict`: ``tool``,
``lane``, ``partial``, ``devices``, ``platform``, ``graphs``, ``ranks``, ``steps``, ``totals``,
``warnings``); here ``graphs`` is empty (nothing is compiled) and ``ranks`` holds the runs, where
the torch_xla lane has one program for all devices and an empty ``ranks``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spmd._util.atomic_file import atomic_write, file_to_write
from spmd.inspector._dtensor_collectives import CollectiveCall
from spmd.inspector._dtensor_params import ParameterSummary
from spmd.inspector._dtensor_record import CATEGORIES, StepRecord
from spmd.inspector._dtensor_run import RankRun
from spmd.inspector.collectives import CollectiveKind, ring_bytes_sent
from spmd.inspector.report import WarningCode, format_bytes

__all__ = ["DryRunReport", "bytes_sent"]


def bytes_sent(call: CollectiveCall) -> int:
    """Ring-algorithm bytes the rank sends for ``call`` (as the torch_xla lane counts them)."""
    try:
        kind = CollectiveKind(call.op)
    except ValueError:  # broadcast, send...: what the rank puts in
        return call.bytes_in if len(call.ranks) > 1 else 0
    return ring_bytes_sent(kind, call.bytes_out, len(call.ranks))


def _ranks_text(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 1 and ranks == tuple(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}..{ranks[-1]}"
    if len(ranks) > 2 and len({b - a for a, b in zip(ranks, ranks[1:])}) == 1:
        return f"{ranks[0]}..{ranks[-1]} step {ranks[1] - ranks[0]}"
    return ",".join(map(str, ranks))


def _step_dict(s: StepRecord) -> dict[str, Any]:
    return {
        "step": s.step,
        "complete": s.complete,
        "peak_bytes": s.peak_bytes,
        "peak_module": s.module,
        "peak_phase": s.phase,
        "at_peak": s.at_peak,
        "category_max": s.category_max,
        "bytes_sent": sum(bytes_sent(c) for c in s.collectives),
        "collectives": [
            {
                "op": c.op,
                "torch_op": c.torch_op,
                "ranks": list(c.ranks),
                "bytes_in": c.bytes_in,
                "bytes_out": c.bytes_out,
                "dtype": c.dtype,
                "phase": c.phase,
                "module": c.module,
                "bytes_sent": bytes_sent(c),
            }
            for c in s.collectives
        ],
    }


def _uneven_warning(summary: ParameterSummary, fsdp: bool) -> dict[str, str]:
    pad = format_bytes(sum(p.padding_bytes for p in summary.padded))
    first = summary.padded[0]
    split = f"{len(summary.padded)} parameter(s) split unevenly, e.g. {first.name} {list(first.shape)} dim {first.dim} "
    if fsdp:
        cost = (
            f"over {first.ranks} ranks: FSDP pads them, so their gathered buffers hold {pad} of padding, gathered "
            "(and sent) every time the weights are. Fewer ranks on the FSDP axis, or dims that divide by it, remove it."
        )
    else:
        cost = (
            f"over {first.ranks} ranks: the last ranks hold fewer rows (or none), so the ranks' memory differs (--ranks "
            f"worst runs one of each), and DTensor pads the shards to gather them ({pad} over all ranks). Dims that "
            "divide by the ranks sharding them remove it."
        )
    return {"code": WarningCode.UNEVEN_SHARD.value, "graph": "", "message": split + cost}


@dataclass(frozen=True)
class DryRunReport:
    """The dry runs of one script: one `RankRun` per rank inspected; ``ignore``: warning codes
    left out (`WarningCode` values)."""

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
        """The run with the highest peak."""
        return max(self.runs, key=lambda r: (r.peak_bytes, -r.rank))

    def warnings(self) -> list[dict[str, str]]:
        """Uneven (padded) shards with their cost, and the placeholders the script read."""
        out = []
        run = self.worst()
        summary = run.parameters
        if summary is not None and summary.padded:
            out.append(_uneven_warning(summary, run.fsdp))
        for line, calls in sorted(run.placeholders.items()):
            out.append(
                {
                    "code": WarningCode.DATA_DEPENDENT.value,
                    "graph": "",
                    "message": f"{line} read a tensor's value {calls} time(s) (.item(), bool(), printing): the "
                    "dry run has no values and gave a placeholder (0); what the script did with it is not real.",
                }
            )
        return [w for w in out if w["code"] not in self.ignore]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict (the torch_xla lane's keys)."""
        worst = self.worst()
        steps = []
        for s in worst.steps:
            steps.append(
                {
                    "step": s.step,
                    "graphs": [],
                    "collectives": dict(sorted(Counter(c.op for c in s.collectives).items())),
                    "bytes_sent_per_device": sum(bytes_sent(c) for c in s.collectives),
                    "peak_bytes_per_device": s.peak_bytes,
                }
            )
        return {
            "tool": "spmd.inspector",
            "lane": "dtensor",
            "partial": self.partial or None,
            "devices": self.world,
            "platform": "fake process group (dry run)",
            "graphs": [],
            "ranks": [self._run_dict(r) for r in self.runs],
            "steps": steps,
            "totals": {
                "graphs": 0,
                "peak_bytes_per_device": worst.peak_bytes,
                "bytes_sent_per_device": max((t["bytes_sent_per_device"] for t in steps), default=0),
                "collectives": dict(sorted(Counter(c.op for s in worst.steps for c in s.collectives).items())),
            },
            "warnings": self.warnings(),
        }

    def _run_dict(self, run: RankRun) -> dict[str, Any]:
        summary = run.parameters
        zero = None
        if summary is not None and run.fsdp:
            zero = {
                "parameters": summary.count,
                "parameter_bytes": summary.global_bytes,
                "zero3_state_bytes": summary.zero3_state_bytes,
                "zero3_min_sent_bytes": summary.zero3_sent_bytes,
            }
        return {
            "rank": run.rank,
            "root_module": run.root,
            "failure": run.failure or None,
            "failing_line": run.failing_line or None,
            "placeholders": run.placeholders,
            "zero": zero,
            "seconds": round(run.seconds, 3),
            "steps": [_step_dict(s) for s in run.steps],
        }

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write the JSON atomically; the path.

        Raises:
            TypeError, ValueError: ``path`` is not a file path one can write.
        """
        target = file_to_write(path, "write_json")
        with atomic_write(target) as tmp:
            tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return target

    def table(self, max_collectives: int = 20) -> str:
        """The report as text: per rank, its steady (last) step in full, the others in a line."""
        ranks = ", ".join(str(r.rank) for r in self.runs)
        lines = [f"spmd.inspector: dry run of {self.script} as rank(s) {ranks} of {self.world} (fake process group)"]
        if self.partial:
            lines.append(f"PARTIAL REPORT: {self.partial}; the steps before it are below.")
        for run in self.runs:
            lines += self._run_lines(run, max_collectives)
        for w in self.warnings():
            lines.append(f"warning {w['code']}: {w['message']}")
        return "\n".join(lines)

    def _run_lines(self, run: RankRun, max_collectives: int) -> list[str]:
        lines = []
        for s in run.steps:
            sent = sum(bytes_sent(c) for c in s.collectives)
            where = f"{s.phase} of {s.module}" if s.module else s.phase
            lines.append("")
            lines.append(
                f"== rank {run.rank}, step {s.step}{'' if s.complete else ' (incomplete)'}: peak "
                f"{format_bytes(s.peak_bytes)} in {where}; {len(s.collectives)} collectives, {format_bytes(sent)} sent"
            )
            if s is not run.steps[-1]:
                continue
            width = max(len(n) for n in CATEGORIES.values())
            lines.append(f"  {'category':<{width}}{'at peak':>14}{'max':>14}")
            for name in CATEGORIES.values():
                at, top = s.at_peak.get(name, 0), s.category_max.get(name, 0)
                if at or top:
                    lines.append(f"  {name:<{width}}{format_bytes(at):>14}{format_bytes(top):>14}")
            lines += self._collective_lines(s, max_collectives)
        lines += self._zero_lines(run)
        return lines

    @staticmethod
    def _collective_lines(s: StepRecord, max_collectives: int) -> list[str]:
        lines = [f"  {'#':>4} {'op':<15}{'ranks':<18}{'in':>12}{'out':>12}  {'phase':<9} module"]
        for c in s.collectives[:max_collectives]:
            lines.append(
                f"  {c.position:>4} {c.op:<15}{_ranks_text(c.ranks):<18}{format_bytes(c.bytes_in):>12}"
                f"{format_bytes(c.bytes_out):>12}  {c.phase:<9} {c.module}"
            )
        if len(s.collectives) > max_collectives:
            lines.append(f"  ... {len(s.collectives) - max_collectives} more (see --json)")
        return lines

    @staticmethod
    def _zero_lines(run: RankRun) -> list[str]:
        summary = run.parameters
        if summary is None or not run.steps:
            return []
        last = run.steps[-1]
        held = sum(last.category_max.get(k, 0) for k in ("sharded_parameters", "sharded_gradients", "optimizer_state"))
        sent = sum(bytes_sent(c) for c in last.collectives)
        if not run.fsdp:  # ZeRO-3's bounds are for FSDP's weights; tensor parallelism sends activations
            return [
                f"  parameters: P = {summary.count:,}, {format_bytes(summary.global_bytes)}; this rank holds "
                f"{format_bytes(last.category_max.get('sharded_parameters', 0))} of them, and with their gradients and "
                f"optimizer state {format_bytes(held)} (no fully_shard: ZeRO-3's bounds do not apply)"
            ]
        return [
            f"  ZeRO-3 per rank: weights + gradients + Adam state 4P/N = {format_bytes(summary.zero3_state_bytes)} "
            f"(here {format_bytes(held)}); sent 3P(N-1)/N = {format_bytes(summary.zero3_sent_bytes)} "
            f"(here {format_bytes(sent)}); P = {summary.count:,} parameters, {format_bytes(summary.global_bytes)}"
        ]
