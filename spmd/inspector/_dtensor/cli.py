"""``python -m spmd.inspector --world N [--rank r | --ranks all|worst] [--steps k] SCRIPT``: the
dry run on the DTensor backend (no torch_xla): the script runs as each chosen rank of an N-rank job
in this process; `spmd.inspector.cli` prints the report (and writes it with ``--json``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spmd._util.ranks import rank_ranges
from spmd.inspector._dtensor.agreement import comparison_ranks
from spmd.inspector._dtensor.report import DryRunReport
from spmd.inspector._dtensor.run import RankRun, run_rank
from spmd.inspector._runner import Outcome

__all__ = ["chosen_ranks", "dry_run"]


def chosen_ranks(args: argparse.Namespace) -> list[int]:
    """The ranks ``--rank``/``--ranks`` ask to run first. ``worst`` starts with rank 0, whose
    run says which other ranks can differ (`worst_runs`).

    Raises:
        SystemExit(2): ``--rank`` is not below ``--world``.
    """
    world = args.world
    if args.rank is not None:
        if args.rank >= world:
            print(f"error: --rank {args.rank} is not a rank of --world {world}; give 0..{world - 1}.", file=sys.stderr)
            raise SystemExit(2)
        return [args.rank]
    if args.ranks == "all":
        return list(range(world))
    return [0]


def worst_runs(args: argparse.Namespace, script: Path, first: RankRun) -> list[RankRun]:
    """``--ranks worst`` after rank 0's run (``first``, which grouped the ranks by the local
    shapes of their shards): one run per other group, its first rank; all the runs. Ranks of a
    group run the same ops on the same shapes, so the highest of these peaks is the world's."""
    runs = [first]
    others = [group[0] for group in first.groups if 0 not in group]
    sets = " | ".join(rank_ranges(group, most=8) for group in first.groups)
    print(
        f"--ranks worst: the ranks' shards take {len(first.groups)} set(s) of shapes ({sets}); "
        f"running one rank of each: {', '.join(str(r) for r in [0, *others])}"
    )
    for rank in others:
        run = run_rank(script, list(args.script_args), world=args.world, rank=rank, steps=args.steps or 2)
        runs.append(run)
        if run.failure:
            break
    return runs


def _missing_support() -> str:
    """What this torch lacks for a dry run ('' if nothing): the fake process group's "every rank
    sends what this one does" (torch 2.15; the torch_xla lane's torch 2.9 has no such option)."""
    from spmd._util.torch_compat import FakeProcessGroup

    if hasattr(FakeProcessGroup, "Options") and hasattr(FakeProcessGroup.Options(), "simulate_uniform_ranks"):
        return ""
    import torch

    return (
        f"the dry run (--world) needs the fake process group of torch 2.15 (simulate_uniform_ranks); this is "
        f"torch {torch.__version__}. Run it in the current lane's environment (pip install 'xla-spmd[current]'), "
        "or leave out --world to inspect the torch_xla program."
    )


def _runs(args: argparse.Namespace, script: Path) -> list[RankRun]:
    """The runs ``--rank``/``--ranks`` ask for, up to the first that fails (every rank runs the
    same program: the next would fail alike)."""
    runs: list[RankRun] = []
    worst = args.ranks == "worst"
    for rank in chosen_ranks(args):
        run = run_rank(
            script, list(args.script_args), world=args.world, rank=rank, steps=args.steps or 2, group_ranks=worst
        )
        runs.append(run)
        if run.failure:
            break
    if worst and not runs[0].failure:
        runs = worst_runs(args, script, runs[0])
    return runs


def _comparisons(args: argparse.Namespace, script: Path, runs: list[RankRun]) -> list[RankRun]:
    """Runs of the ranks to compare collectives with that ``runs`` lack (`comparison_ranks` of the
    first), up to the first that fails; none after a failure, or when every rank ran."""
    if args.ranks == "all" or runs[-1].failure:
        return []
    have = {r.rank for r in runs}
    compared: list[RankRun] = []
    for rank in comparison_ranks(runs[0].rank, args.world, runs[0].issued):
        if rank in have:
            continue
        run = run_rank(script, list(args.script_args), world=args.world, rank=rank, steps=args.steps or 2)
        compared.append(run)
        if run.failure:
            break
    return compared


def dry_run(args: argparse.Namespace, script: Path) -> Outcome:
    """Run the dry runs (and the runs of ranks to compare collectives with); their report, and
    the exit code (the failing script's, 1 when ranks would not meet in the same collectives or
    would block each other by their order across groups, 2 when this torch cannot dry-run)."""
    missing = _missing_support()
    if missing:
        return Outcome(None, 2, f"error: {missing}")
    runs = _runs(args, script)
    ignore = frozenset(args.ignore)
    compared = tuple(_comparisons(args, script, runs))
    dry = DryRunReport(str(script), args.world, tuple(runs), ignore, compared)
    if args.ranks == "worst" and not dry.partial:
        highest = dry.worst()
        tried = ", ".join(str(r.rank) for r in runs)
        print(
            f"--ranks worst: ran ranks {tried}; rank {highest.rank} has the highest peak, {highest.peak_bytes:,} bytes"
        )
        others = tuple(r for r in runs if r is not highest) + compared
        dry = DryRunReport(str(script), args.world, (highest,), ignore, others)
    if dry.mismatch or dry.deadlock:
        return Outcome(dry.report, 1, dry.mismatch or dry.deadlock)
    if not dry.partial:
        return Outcome(dry.report, notes=(dry.agreement_note(),) if dry.agreement_note() else ())
    end = next(r.end for r in runs + list(compared) if r.failure)
    return Outcome(dry.report, end.exit_code or 1, dry.partial, end.traceback)
