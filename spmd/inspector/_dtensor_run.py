"""Run a training script, unmodified, as one rank of a job that does not exist: the fake
process group (`fake_world`), fake tensors for everything the script allocates, placeholders for
the values it reads back, and the `Recorder` following its steps.

Fake tensors carry shape, dtype and device but no storage, so a model of any size is "built"
and "trained" in the time the Python takes; memory is what the tensors would hold, read from
their sizes. Parameters built inside the mode are fake from the start: no rank-sized, let alone
model-sized, allocation happens (the meta-first build a real run gets from deferred init).
"""

from __future__ import annotations

import runpy
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from spmd.inspector._dtensor_params import ParameterSummary
from spmd.inspector._dtensor_placeholders import Placeholders, user_line
from spmd.inspector._dtensor_record import Recorder, StepRecord, StopScript
from spmd.inspector._dtensor_shards import noting_shard_shapes
from spmd.inspector._dtensor_world import fake_world

__all__ = ["RankRun", "run_rank"]


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
            when every split is even; `spmd.inspector._dtensor_shards`), if asked for, else ().
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

    @property
    def peak_bytes(self) -> int:
        """The highest step peak."""
        return max((s.peak_bytes for s in self.steps), default=0)


def _failure_of(error: BaseException) -> tuple[str, str]:
    """(one-line description, the script's line that raised)."""
    frames = traceback.extract_tb(error.__traceback__)
    text = f"{type(error).__name__}: {error}".strip().rstrip(":")
    return text.splitlines()[0] if text else type(error).__name__, user_line(list(frames))


def run_rank(
    script: Path, script_args: list[str], *, world: int, rank: int, steps: int, group_ranks: bool = False
) -> RankRun:
    """Run ``script script_args`` as rank ``rank`` of ``world`` for ``steps`` steps;
    ``group_ranks``: also group the world's ranks by the shapes of their shards."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    started = time.perf_counter()
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.resolve().parent))
    failure = failing_line = ""
    recorder = Recorder(steps)
    placeholders = Placeholders()
    groups: tuple[tuple[int, ...], ...] = ()
    try:
        with (
            fake_world(world, rank),
            FakeTensorMode(allow_non_fake_inputs=True),
            placeholders,
            noting_shard_shapes(group_ranks) as shapes,
            recorder,
        ):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except StopScript:
                pass
            except SystemExit as e:
                if e.code not in (0, None):
                    failure, failing_line = f"the script exited with code {e.code}", ""
        groups = shapes.groups(world) if shapes is not None else ()
    except Exception as e:  # noqa: BLE001 - the script raised: report the steps before it
        failure, failing_line = _failure_of(e)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    if not failure and not recorder.steps:
        failure = (
            "no training step was seen: the inspector follows the module an optimizer trains (a step ends at "
            "the optimizer's step), or with no optimizer the first module called that has parameters (a step "
            "ends at its backward); this script called no module with parameters"
        )
    return RankRun(
        rank,
        world,
        tuple(recorder.steps),
        dict(placeholders.lines),
        failure,
        failing_line,
        recorder.root,
        recorder.parameters,
        time.perf_counter() - started,
        recorder.fsdp,
        groups,
    )
