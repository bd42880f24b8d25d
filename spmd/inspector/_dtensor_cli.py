"""``python -m spmd.inspector --world N [--rank r | --ranks all|worst] [--steps k] SCRIPT``: the
dry run on the DTensor lane (no torch_xla): the script runs as each chosen rank of an N-rank job
in this process, and the report is printed (and written with ``--json``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spmd.inspector._dtensor_report import DryRunReport
from spmd.inspector._dtensor_run import RankRun, run_rank

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


def _ranks_text(groups: tuple[tuple[int, ...], ...]) -> str:
    def span(ranks: tuple[int, ...]) -> str:
        if len(ranks) > 1 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
            return f"{ranks[0]}..{ranks[-1]}"
        return ",".join(map(str, ranks[:8])) + (f",... ({len(ranks)} ranks)" if len(ranks) > 8 else "")

    return " | ".join(span(g) for g in groups)


def worst_runs(args: argparse.Namespace, script: Path, first: RankRun) -> list[RankRun]:
    """``--ranks worst`` after rank 0's run (``first``, which grouped the ranks by the local
    shapes of their shards): one run per other group, its first rank; all the runs. Ranks of a
    group run the same ops on the same shapes, so the highest of these peaks is the world's."""
    runs = [first]
    others = [group[0] for group in first.groups if 0 not in group]
    print(
        f"--ranks worst: the ranks' shards take {len(first.groups)} set(s) of shapes ({_ranks_text(first.groups)}); "
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
    from torch.testing._internal.distributed.fake_pg import FakeProcessGroup

    if hasattr(FakeProcessGroup, "Options") and hasattr(FakeProcessGroup.Options(), "simulate_uniform_ranks"):
        return ""
    import torch

    return (
        f"the dry run (--world) needs the fake process group of torch 2.15 (simulate_uniform_ranks); this is "
        f"torch {torch.__version__}. Run it in the current lane's environment (pip install 'xla-spmd[current]'), "
        "or leave out --world to inspect the torch_xla program."
    )


def dry_run(args: argparse.Namespace, script: Path) -> int:
    """Run the dry runs, print the report; the exit code (1 when the script failed, 2 when this
    torch cannot dry-run)."""
    missing = _missing_support()
    if missing:
        print(f"spmd.inspector: error: {missing}", file=sys.stderr)
        return 2
    runs: list[RankRun] = []
    worst = args.ranks == "worst"
    for rank in chosen_ranks(args):
        run = run_rank(
            script, list(args.script_args), world=args.world, rank=rank, steps=args.steps or 2, group_ranks=worst
        )
        runs.append(run)
        if run.failure:
            break  # every rank runs the same program: the next would fail alike
    if worst and not runs[0].failure:
        runs = worst_runs(args, script, runs[0])
    ignore = frozenset(args.ignore)
    report = DryRunReport(str(script), args.world, tuple(runs), ignore)
    if worst and not report.partial:
        highest = report.worst()
        tried = ", ".join(str(r.rank) for r in runs)
        print(
            f"--ranks worst: ran ranks {tried}; rank {highest.rank} has the highest peak, {highest.peak_bytes:,} bytes"
        )
        report = DryRunReport(str(script), args.world, (highest,), ignore)
    print(report.table(max_collectives=args.max_collectives))
    if args.json is not None:
        print(f"\nJSON report: {report.write_json(args.json)}")
    if report.partial:
        print(f"\nspmd.inspector: {report.partial}", file=sys.stderr)
        return 1
    return 0
