"""``python -m spmd.inspector SCRIPT`` on the torch_xla backend: XLA's dumps requested before
torch_xla starts, the script run under `capture` on virtual devices (or the TPU), stopped after
``--steps`` syncs; `spmd.inspector.cli` prints the report."""

from __future__ import annotations

import argparse
import functools
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spmd.inspector._runner import Outcome, StopScript, run_script

__all__ = ["inspect"]


def _stop_after(steps: int) -> Callable[[], None]:
    """Wrap the runtime's step function so the script stops after ``steps`` steps; returns the
    function that unwraps it."""
    from spmd._backend import torch_xla_backend

    ((owner, attr),) = torch_xla_backend.step_functions()
    original = getattr(owner, attr)
    count = 0

    @functools.wraps(original)
    def sync(*args: Any, **kwargs: Any) -> Any:
        nonlocal count
        out = original(*args, **kwargs)
        count += 1
        if count >= steps:
            raise StopScript
        return out

    setattr(owner, attr, sync)
    return lambda: setattr(owner, attr, original)


@contextmanager
def _capturing(args: argparse.Namespace, handles: list[Any]) -> Iterator[None]:
    """`capture` around the script (its handle appended to ``handles``), stopping it after
    ``--steps`` steps."""
    from spmd.inspector._xla.capture import capture

    with capture(ignore=args.ignore, replicated_threshold_bytes=args.threshold, warmup_steps=args.warmup_steps) as h:
        handles.append(h)
        restore = _stop_after(args.steps) if args.steps else (lambda: None)
        try:
            yield
        finally:
            restore()


def _run(args: argparse.Namespace, script: Path, notes: tuple[str, ...]) -> Outcome:
    """Run the script under `capture`; its report and exit code."""
    from spmd.inspector._xla.capture import InspectorError

    handles: list[Any] = []
    try:
        end = run_script(script, args.script_args, _capturing(args, handles))
    except InspectorError as e:  # nothing to report (nothing compiled, dumps requested too late)
        return Outcome(None, 2, str(e).replace("inside capture()", "while the script ran"), notes=notes)
    try:
        report = handles[0].report
    except InspectorError as e:  # the script failed before anything compiled
        return Outcome(None, end.exit_code, f"{e}; the script: {end.describe()}", end.traceback, notes)
    return Outcome(report, end.exit_code, end.describe(), end.traceback, notes)


@contextmanager
def inspect(args: argparse.Namespace, script: Path) -> Iterator[Outcome]:
    """Dump, run and read the script's graphs: the report and exit code (2: bad options), for the
    ``with`` block; a temporary dump directory is removed after it (the report's JSON copies the
    HLO files from there)."""
    if args.rank is not None or args.ranks is not None:
        yield Outcome(None, 2, "--rank and --ranks choose ranks of a dry run: give --world N too.")
        return
    from spmd.devices import configure_default_devices
    from spmd.inspector._xla.dump import dump_dir_from_flags, prepare

    configure_default_devices(args.devices)
    keep_dumps = args.dump_dir is not None or dump_dir_from_flags() is not None
    try:
        dump_dir = prepare(args.dump_dir)  # before torch_xla is imported: dumps and module names
    except ValueError as e:  # --dump-dir and XLA_FLAGS's --xla_dump_to disagree
        yield Outcome(None, 2, f"--dump-dir {args.dump_dir}: {e} (or leave out --dump-dir)")
        return
    try:
        yield _run(args, script, (f"XLA dumps: {dump_dir}",) if keep_dumps else ())
    finally:  # also on Ctrl-C: the dumps are megabytes per graph
        if not keep_dumps:
            shutil.rmtree(dump_dir, ignore_errors=True)
