"""``python -m spmd.inspector SCRIPT [ARGS]``: run a training script on virtual devices and
report per-device memory and collectives of every graph it compiles; with ``--world N`` (or
without torch_xla), a dry run of the script as ranks of an N-rank DTensor job.

One CLI for both backends: the flags, the choice of capture (`spmd.inspector._xla.cli`,
`spmd.inspector._dtensor.cli`), and printing what it found (the table, ``--json``, the script's
failure and exit code)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from spmd._util.cli_args import input_file, int_in, output_dir, output_file
from spmd.devices import MAX_DEVICES
from spmd.inspector._runner import Outcome
from spmd.inspector.report import WarningCode

__all__ = ["main", "build_parser"]

MAX_RANKS = 1 << 20
"""The largest ``--world`` (a dry run's process group numbers ranks in C++ ints)."""

# Findings that are errors: a dry run whose ranks would not meet never passes, so --ignore
# cannot leave them out.
_ERRORS = (WarningCode.UNMATCHED_COLLECTIVES, WarningCode.COLLECTIVE_ORDER_DEADLOCK)
_XLA_ONLY = {"devices": 8, "dump_dir": None, "threshold": 1 << 20, "warmup_steps": 2}
"""The flags only torch_xla's capture reads (argparse's ``dest``) and their defaults: each
defaults to None in the parser, so a dry run can tell one given from one left out."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, naming what is missing when no script is given (argparse lists the
    script's optional arguments as required too)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required: script"):
            message = "give the script to run: python -m spmd.inspector [options] SCRIPT [its arguments]"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    parser = _Parser(
        prog="python -m spmd.inspector",
        description=(
            "Dry-run a training script: run it on virtual CPU devices (or the TPU it finds) and report, for "
            "every compiled graph, per-device peak memory from XLA's buffer assignment and every collective "
            "of the partitioned HLO, with warnings. With --world N (and where torch_xla is not installed): run it "
            "as a rank of an N-rank DTensor job on the fake process group and report that rank's memory by "
            "category and collectives per step."
        ),
        # The script's own flags follow it; a prefix of ours among them (--d for --devices) would be refused.
        allow_abbrev=False,
    )
    parser.add_argument("script", type=input_file, help="the Python script to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    parser.add_argument(
        "--devices", type=int_in(1, MAX_DEVICES), default=None, help="virtual CPU devices when no TPU is present (8)"
    )
    parser.add_argument(
        "--steps",
        type=int_in(1),
        default=None,
        help="stop the script after this many steps (torch_xla: syncs, default all; --world: optimizer steps, 2)",
    )
    _dry_run_flags(parser)
    parser.add_argument(
        "--json", type=output_file, default=None, help="write the report as JSON (and the HLO beside it)"
    )
    parser.add_argument(
        "--dump-dir", type=output_dir, default=None, help="keep XLA's dumps here (default: a temp dir, removed)"
    )
    parser.add_argument(
        "--threshold",
        type=int_in(0),
        default=None,
        help="warn about replicated tensors of at least this many bytes (1 MiB)",
    )
    parser.add_argument("--warmup-steps", type=int_in(0), default=None, help="steps allowed to compile (2)")
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        choices=[c.value for c in WarningCode if c not in _ERRORS],
        help="leave out a kind of warning (repeatable)",
    )
    parser.add_argument(
        "--max-collectives", type=int_in(0), default=20, help="largest collectives listed per graph (20)"
    )
    return parser


def _dry_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the dry run on DTensor: the job's size and the ranks to run as."""
    dry = parser.add_argument_group("dry run on DTensor (the backend without torch_xla)")
    dry.add_argument(
        "--world",
        type=int_in(1, MAX_RANKS),
        default=None,
        help="run as a rank of a job of this many ranks, on the fake process group (default 8 without torch_xla)",
    )
    which = dry.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int_in(0, MAX_RANKS - 1), default=None, help="the rank to run as (0)")
    which.add_argument(
        "--ranks", choices=["all", "worst"], default=None, help="every rank, or the one with the highest peak"
    )


def _dry_run(args: argparse.Namespace) -> bool:
    """Whether to dry-run on DTensor: ``--world`` given, or no torch_xla to compile with."""
    import importlib.util

    return args.world is not None or importlib.util.find_spec("torch_xla") is None


def _xla_only_given(args: argparse.Namespace) -> list[str]:
    """The torch_xla-only flags given (``['--devices', '--dump-dir']``)."""
    return ["--" + name.replace("_", "-") for name in _XLA_ONLY if getattr(args, name) is not None]


def _with_xla_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the torch_xla-only flags left out set to their defaults."""
    for name, default in _XLA_ONLY.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def _refuse_xla_only(args: argparse.Namespace) -> Outcome | None:
    """The refusal of torch_xla-only flags in a dry run (they would be ignored), or None."""
    given = _xla_only_given(args)
    if not given:
        return None
    why = "--world asks for" if args.world is not None else "without torch_xla this is"
    return Outcome(
        None,
        2,
        f"error: {', '.join(given)} only apply to torch_xla's compiled graphs, and {why} the dry run on DTensor, "
        "which does not read them; leave them out (or leave out --world to inspect the torch_xla program).",
    )


def _show(outcome: Outcome, args: argparse.Namespace) -> int:
    """Print what a capture found, the same way for both backends; the exit code."""
    report = outcome.report
    if report is not None:
        print(report.table(max_collectives=args.max_collectives))
        if args.json is not None:
            path = report.write_json(args.json)
            hlo = f" (optimized HLO in {path.with_name(path.stem + '.hlo')}/)" if report.graphs else ""
            print(f"\nJSON report: {path}{hlo}")
    if outcome.failure:
        print(f"\nspmd.inspector: {outcome.failure.rstrip()}", file=sys.stderr)
    if outcome.traceback:
        print(outcome.traceback.rstrip(), file=sys.stderr)
    for note in outcome.notes:
        print(note)
    return outcome.exit_code


def main(argv: list[str] | None = None) -> int:
    """Run the CLI: the script under the capture of its backend (the dry run on DTensor with
    ``--world`` or without torch_xla, else torch_xla's); returns the exit code."""
    args = build_parser().parse_args(argv)
    script = Path(args.script)
    if _dry_run(args):
        refused = _refuse_xla_only(args)
        if refused is not None:
            return _show(refused, args)
        from spmd.inspector._dtensor.cli import dry_run

        args.world = args.world or 8
        return _show(dry_run(args, script), args)
    from spmd.inspector._xla.cli import inspect

    with inspect(
        _with_xla_defaults(args), script
    ) as outcome:  # its temporary dumps are removed after the JSON copied them
        return _show(outcome, args)
