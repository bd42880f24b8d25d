"""``python -m spmd.inspector SCRIPT [ARGS]``: run a training script on virtual devices and
report per-device memory and collectives of every graph it compiles; with ``--world N`` (or
without torch_xla), a dry run of the script as ranks of an N-rank DTensor job
(`spmd.inspector._dtensor_cli`)."""

from __future__ import annotations

import argparse
import functools
import runpy
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from spmd._util.cli_args import input_file, int_in, output_dir, output_file
from spmd.devices import MAX_DEVICES
from spmd.inspector.report import WarningCode

__all__ = ["main", "build_parser"]

MAX_RANKS = 1 << 20
"""The largest ``--world`` (a dry run's process group numbers ranks in C++ ints)."""


class _StopScript(BaseException):
    """Raised inside the script after ``--steps`` steps; BaseException so the script's own
    ``except Exception`` blocks do not swallow it."""


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    parser = argparse.ArgumentParser(
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
        "--devices", type=int_in(1, MAX_DEVICES), default=8, help="virtual CPU devices when no TPU is present (8)"
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
        default=1 << 20,
        help="warn about replicated tensors of at least this many bytes (1 MiB)",
    )
    parser.add_argument("--warmup-steps", type=int_in(0), default=2, help="steps allowed to compile (2)")
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        choices=[c.value for c in WarningCode],
        help="leave out a kind of warning (repeatable)",
    )
    parser.add_argument(
        "--max-collectives", type=int_in(0), default=20, help="largest collectives listed per graph (20)"
    )
    return parser


def _dry_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the dry run on DTensor: the job's size and the ranks to run as."""
    dry = parser.add_argument_group("dry run on DTensor (the lane without torch_xla)")
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


def _stop_after(steps: int) -> Any:
    """Wrap the runtime's step function so the script stops after ``steps`` steps; returns the
    function that unwraps it."""
    from spmd._backend import backend

    ((owner, attr),) = backend.step_functions()
    original = getattr(owner, attr)
    count = 0

    @functools.wraps(original)
    def sync(*args: Any, **kwargs: Any) -> Any:
        nonlocal count
        out = original(*args, **kwargs)
        count += 1
        if count >= steps:
            raise _StopScript
        return out

    setattr(owner, attr, sync)
    return lambda: setattr(owner, attr, original)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = build_parser().parse_args(argv)
    script = Path(args.script)
    import importlib.util

    if args.world is not None or importlib.util.find_spec("torch_xla") is None:
        from spmd.inspector._dtensor_cli import dry_run

        args.world = args.world or 8
        return dry_run(args, script)
    if args.rank is not None or args.ranks is not None:
        print("spmd.inspector: --rank and --ranks choose ranks of a dry run: give --world N too.", file=sys.stderr)
        return 2

    from spmd.devices import configure_default_devices
    from spmd.inspector.dump import dump_dir_from_flags, prepare

    configure_default_devices(args.devices)
    keep_dumps = args.dump_dir is not None or dump_dir_from_flags() is not None
    try:
        dump_dir = prepare(args.dump_dir)  # before torch_xla is imported: dumps and module names
    except ValueError as e:  # --dump-dir and XLA_FLAGS's --xla_dump_to disagree
        print(f"spmd.inspector: --dump-dir {args.dump_dir}: {e} (or leave out --dump-dir)", file=sys.stderr)
        return 2
    try:
        return _run(args, script, dump_dir, keep_dumps)
    finally:  # also on Ctrl-C: the dumps are megabytes per graph
        if not keep_dumps:
            shutil.rmtree(dump_dir, ignore_errors=True)


def _run(args: argparse.Namespace, script: Path, dump_dir: Path, keep_dumps: bool) -> int:
    """Run the script under `capture`, print the report; the exit code."""
    from spmd.inspector.capture import InspectorError, capture

    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args.script_args]
    sys.path.insert(0, str(script.resolve().parent))
    exit_code, failure = 0, ""
    report: Any = None
    try:
        with capture(
            ignore=args.ignore, replicated_threshold_bytes=args.threshold, warmup_steps=args.warmup_steps
        ) as report:
            restore = _stop_after(args.steps) if args.steps else (lambda: None)
            try:
                runpy.run_path(str(script), run_name="__main__")
            except _StopScript:
                pass
            except SystemExit as e:
                if e.code not in (0, None):
                    raise
            finally:
                restore()
    except SystemExit as e:  # the script exited with an error code: report, then keep it
        exit_code = e.code if isinstance(e.code, int) else 1
        failure = f"the script exited with code {e.code}"
    except InspectorError as e:  # nothing to report (nothing compiled, dumps requested too late)
        exit_code = 2
        report = None  # its failure is this error: say it once
        failure = str(e).replace("inside capture()", "while the script ran")
    except Exception:  # the script raised: report what compiled, print its traceback, exit 1
        exit_code = 1
        failure = traceback.format_exc()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    try:
        finished = report.report if report is not None else None
    except InspectorError as e:
        finished = None
        print(f"spmd.inspector: {e}", file=sys.stderr)
    if finished is not None:
        print(finished.table(max_collectives=args.max_collectives))
        if args.json is not None:
            path = finished.write_json(args.json)
            print(f"\nJSON report: {path} (optimized HLO in {path.with_name(path.stem + '.hlo')}/)")
    if failure:
        print(f"\nspmd.inspector: {failure.rstrip()}", file=sys.stderr)
    if keep_dumps:
        print(f"XLA dumps: {dump_dir}")
    return exit_code
