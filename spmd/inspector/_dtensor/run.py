"""Run a training script, unmodified, as one rank of a job that does not exist: the fake
process group (`fake_world`), fake tensors for everything the script allocates, placeholders for
the values it reads back, and the `Recorder` following its steps.

Fake tensors carry shape, dtype and device but no storage, so a model of any size is "built"
and "trained" in the time the Python takes; memory is what the tensors would hold, read from
their sizes. Parameters built inside the mode are fake from the start: no rank-sized, let alone
model-sized, allocation happens (the meta-first build a real run gets from deferred init).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spmd._util.memory import format_bytes
from spmd._util.ranks import rank_ranges
from spmd.inspector._dtensor.agreement import CollectiveLog, Issued
from spmd.inspector._dtensor.eager import RunEagerly
from spmd.inspector._dtensor.params import ParameterSummary
from spmd.inspector._dtensor.placeholders import Placeholders
from spmd.inspector._dtensor.record import CATEGORIES, Recorder, StepRecord
from spmd.inspector._dtensor.shards import ShardShapes, noting_shard_shapes
from spmd.inspector._dtensor.world import fake_world
from spmd.inspector._runner import ScriptEnd, run_script
from spmd.inspector.report import StepTotals

__all__ = ["RankRun", "run_rank"]

_NO_STEP = (
    "no training step was seen: the inspector follows the module an optimizer trains (a step ends at "
    "the optimizer's step), or with no optimizer the first module called that has parameters (a step "
    "ends at its backward); this script called no module with parameters"
)


@dataclass(frozen=True)
class RankRun:
    """What one rank's dry run saw.

    Attributes:
        rank: the rank.
        world: the ranks of the job.
        steps: the steps recorded, in order.
        placeholders: ``{'script.py:42': calls}``: where the script read a value back and got a
            placeholder.
        failure: why the script stopped before its steps were recorded ('' if it did not).
        failing_line: the script's line that raised (``script.py:42``), or ''.
        root: the class of the root module followed ('' if none was found).
        parameters: its parameters summed, if one was found.
        seconds: wall time of the run.
        fsdp: whether the root is ``fully_shard``-ed (ZeRO's bounds apply to it).
        groups: the ranks of the world grouped by the local shapes of their shards (one group
            when every split is even; `spmd.inspector._dtensor.shards`), if asked for, else ().
        end: how the script ended (`spmd.inspector._runner.ScriptEnd`).
        issued: every collective the rank issued in the whole run, in order (to compare with
            other ranks': `spmd.inspector._dtensor.agreement`).
        compiled: ``{'script.py:12': calls}``: where the script called ``torch.compile``, which
            the dry run runs eagerly (`spmd.inspector._dtensor.eager`).
    """

    rank: int
    world: int
    steps: tuple[StepRecord, ...]
    placeholders: dict[str, int] = field(default_factory=dict)
    failure: str = ""
    failing_line: str = ""
    root: str = ""
    parameters: ParameterSummary | None = None
    seconds: float = 0.0
    fsdp: bool = False
    groups: tuple[tuple[int, ...], ...] = ()
    end: ScriptEnd = ScriptEnd()
    issued: tuple[Issued, ...] = ()
    compiled: dict[str, int] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        """The highest step peak."""
        return max((s.peak_bytes for s in self.steps), default=0)

    def step_totals(self) -> tuple[StepTotals, ...]:
        """Its steps as the report's ``steps`` hold them on both backends."""
        return tuple(s.totals() for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        """The rank's entry in the report's JSON ``ranks``."""
        summary = self.parameters
        zero = None
        if summary is not None and self.fsdp:
            zero = {
                "parameters": summary.count,
                "parameter_bytes": summary.global_bytes,
                "zero3_state_bytes": summary.zero3_state_bytes,
                "zero3_min_sent_bytes": summary.zero3_sent_bytes,
            }
        return {
            "rank": self.rank,
            "root_module": self.root,
            "failure": self.failure or None,
            "failing_line": self.failing_line or None,
            "placeholders": self.placeholders,
            "zero": zero,
            "seconds": round(self.seconds, 3),
            "steps": [s.to_dict() for s in self.steps],
        }

    def table_lines(self, max_collectives: int) -> list[str]:
        """The rank's part of the report's table: a line per step, the steady (last) one in full."""
        lines = []
        for s in self.steps:
            where = f"{s.phase} of {s.module}" if s.module else s.phase
            lines.append("")
            lines.append(
                f"== rank {self.rank}, step {s.step}{'' if s.complete else ' (incomplete)'}: peak "
                f"{format_bytes(s.peak_bytes)} in {where}; {len(s.collectives)} collectives, "
                f"{format_bytes(s.bytes_sent)} sent"
            )
            if s is self.steps[-1]:
                lines += _category_lines(s) + _collective_lines(s, max_collectives)
        return lines + self._zero_lines()

    def _zero_lines(self) -> list[str]:
        summary = self.parameters
        if summary is None or not self.steps:
            return []
        last = self.steps[-1]
        held = sum(last.category_max.get(k, 0) for k in ("sharded_parameters", "sharded_gradients", "optimizer_state"))
        if not self.fsdp:  # ZeRO-3's bounds are for FSDP's weights; tensor parallelism sends activations
            return [
                f"  parameters: P = {summary.count:,}, {format_bytes(summary.global_bytes)}; this rank holds "
                f"{format_bytes(last.category_max.get('sharded_parameters', 0))} of them, and with their gradients and "
                f"optimizer state {format_bytes(held)} (no fully_shard: ZeRO-3's bounds do not apply)"
            ]
        return [
            f"  ZeRO-3 per rank: weights + gradients + Adam state 4P/N = {format_bytes(summary.zero3_state_bytes)} "
            f"(here {format_bytes(held)}); sent 3P(N-1)/N = {format_bytes(summary.zero3_sent_bytes)} "
            f"(here {format_bytes(last.bytes_sent)}); P = {summary.count:,} parameters, "
            f"{format_bytes(summary.global_bytes)}"
        ]


def _category_lines(s: StepRecord) -> list[str]:
    width = max(len(n) for n in CATEGORIES.values())
    lines = [f"  {'category':<{width}}{'at peak':>14}{'max':>14}"]
    for name in CATEGORIES.values():
        at, top = s.at_peak.get(name, 0), s.category_max.get(name, 0)
        if at or top:
            lines.append(f"  {name:<{width}}{format_bytes(at):>14}{format_bytes(top):>14}")
    return lines


def _collective_lines(s: StepRecord, max_collectives: int) -> list[str]:
    lines = [f"  {'#':>4} {'op':<15}{'ranks':<18}{'in':>12}{'out':>12}  {'phase':<9} module"]
    for c in s.collectives[:max_collectives]:
        lines.append(
            f"  {c.position:>4} {c.op:<15}{rank_ranges(c.ranks):<18}{format_bytes(c.bytes_in):>12}"
            f"{format_bytes(c.bytes_out):>12}  {c.phase:<9} {c.module}"
        )
    if len(s.collectives) > max_collectives:
        lines.append(f"  ... {len(s.collectives) - max_collectives} more (see --json)")
    return lines


@contextmanager
def _dry_world(world: int, rank: int, recorder: Recorder, placeholders: Placeholders, log: CollectiveLog,
               eager: RunEagerly, group_ranks: bool, shapes: list[ShardShapes | None]) -> Iterator[None]:  # fmt: skip
    """The world the script runs in: the fake process group, fake tensors, placeholders for the
    values it reads, the log of its collectives, ``torch.compile`` run eagerly, the shapes of its
    shards (noted in ``shapes``) and the recorder."""
    from spmd._util.torch_compat import FakeTensorMode

    with ExitStack() as stack:
        stack.enter_context(fake_world(world, rank))
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(placeholders)
        stack.enter_context(log)
        stack.enter_context(eager)
        shapes.append(stack.enter_context(noting_shard_shapes(group_ranks)))
        stack.enter_context(recorder)
        yield


def run_rank(
    script: Path, script_args: list[str], *, world: int, rank: int, steps: int, group_ranks: bool = False
) -> RankRun:
    """Run ``script script_args`` as rank ``rank`` of ``world`` for ``steps`` steps;
    ``group_ranks``: also group the world's ranks by the shapes of their shards."""
    started = time.perf_counter()
    recorder = Recorder(steps)
    placeholders, log, eager = Placeholders(), CollectiveLog(), RunEagerly()
    shapes: list[ShardShapes | None] = []
    around = _dry_world(world, rank, recorder, placeholders, log, eager, group_ranks, shapes)
    end = run_script(script, script_args, around)
    failure, line = end.failure, end.line
    groups = shapes[0].groups(world) if shapes and shapes[0] is not None and not failure else ()
    if not failure and not recorder.steps:
        failure = _NO_STEP
    return RankRun(
        rank,
        world,
        tuple(recorder.steps),
        dict(placeholders.lines),
        failure,
        line,
        recorder.root,
        recorder.parameters,
        time.perf_counter() - started,
        recorder.fsdp,
        groups,
        end,
        tuple(log.issued),
        dict(eager.lines),
    )
