"""Which runtime an example runs on, decided once at its command line (shared by the examples).

`default_backend` is ``--backend``'s default: ``dtensor`` when the script runs under torchrun
(``WORLD_SIZE`` is set) or where torch_xla is not installed (the current lane), ``torch_xla``
otherwise. `settle_backend` applies it and makes any command work as written:

- ``dtensor`` outside torchrun (``python examples/train_fsdp.py`` on the current lane) launches
  the script's own ranks, as ``torchrun --standalone --nproc_per_node 4`` would (CPU processes
  with gloo; one per GPU where there are GPUs), and exits with their status;
- ``torch_xla`` where it is not installed prints one line, the install command, and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed

__all__ = [
    "CPU_RANKS",
    "ArgumentParser",
    "INT_FLAG_MAX",
    "at_least",
    "default_backend",
    "exit_needing_torch_xla",
    "launch_ranks",
    "non_negative_float",
    "output_dir",
    "output_file",
    "positive_float",
    "ranks_to_launch",
    "settle_backend",
    "under_torchrun",
    "world_flag_error",
]

CPU_RANKS = 4
"""Ranks a script launches for itself on a host without GPUs (a (2, 2) mesh for train_spmd)."""


def under_torchrun() -> bool:
    """Whether torchrun started this process (it sets ``WORLD_SIZE`` for every process it starts)."""
    return "WORLD_SIZE" in os.environ


def _speaks() -> bool:
    """Whether this process prints a command-line error: under torchrun rank 0 only (every rank
    finds the same flag wrong, and torchrun shows every rank's output), else always."""
    return os.environ.get("RANK", "0") == "0"


_PRINTED_KEY = "examples/flag_error_printed"
_WAIT_FOR_RANK_0 = timedelta(seconds=60)


def _exit_once_printed(status: int, message: str | None) -> None:
    """Exit with ``status`` once rank 0 has printed ``message``. A quiet rank that exits first
    makes torchrun stop the others (SIGTERM), and rank 0, still importing or parsing, was stopped
    before it printed: the run failed with no error line. So under torchrun a failing exit waits
    (at most a minute) for rank 0's word through the launch's own store (``MASTER_ADDR``)."""
    if _speaks() and message:
        sys.stderr.write(message)
        sys.stderr.flush()
    if status and under_torchrun():
        _hand_over_to_rank_0()
    raise SystemExit(status)


def _hand_over_to_rank_0() -> None:
    key = f"{_PRINTED_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    try:
        store = torch.distributed.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=_WAIT_FOR_RANK_0
        )
        if _speaks():
            store.set(key, "1")
        else:
            store.wait([key], _WAIT_FOR_RANK_0)
    except (KeyError, ValueError, RuntimeError):  # no store to reach, or rank 0 never spoke: exit anyway
        pass


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage, help and error lines are printed once under an explicit
    torchrun (by rank 0); every rank still exits with argparse's status (2 for an error)."""

    def print_usage(self, file=None) -> None:  # noqa: ANN001 - argparse's signature
        if _speaks():
            super().print_usage(file)

    def print_help(self, file=None) -> None:  # noqa: ANN001 - argparse's signature
        if _speaks():
            super().print_help(file)

    def exit(self, status: int = 0, message: str | None = None):  # noqa: ANN201 - argparse's signature
        _exit_once_printed(status, message)


def world_flag_error(script: str, message: str) -> None:
    """Exit 2 with ``script: error: message``, printed once: for a flag that only the world, known
    once the ranks run, shows to be wrong (under torchrun every rank finds it)."""
    _exit_once_printed(2, f"{os.path.basename(script)}: error: {message}\n")


def default_backend() -> str:
    """``dtensor`` under torchrun or without torch_xla, else ``torch_xla``."""
    if under_torchrun() or importlib.util.find_spec("torch_xla") is None:
        return "dtensor"
    return "torch_xla"


def settle_backend(requested: str | None, script: str, argv: Sequence[str] | None) -> str:
    """The backend this run of ``script`` (called with ``argv``; ``None``: ``sys.argv[1:]``) uses:
    ``requested`` (its ``--backend``) or `default_backend`. Returns only when this process runs it;
    otherwise exits: with the status of the ranks it launched (``dtensor`` outside torchrun), or 2
    with one line (``torch_xla`` where it is not installed)."""
    backend = requested or default_backend()
    if backend == "torch_xla":
        exit_needing_torch_xla(script, "--backend torch_xla (GSPMD on XLA devices)")
    elif not under_torchrun():
        raise SystemExit(launch_ranks(script, sys.argv[1:] if argv is None else argv))
    return backend


def exit_needing_torch_xla(script: str, feature: str, hint: str = "") -> None:
    """Return if torch_xla is installed; else print one line naming ``feature`` and the install
    command (`spmd.errors.TorchXlaNotInstalledError`'s message), then ``hint``, and exit 2."""
    from spmd.backend import torch_xla_backend as backend
    from spmd.errors import TorchXlaNotInstalledError

    try:
        backend.require_torch_xla(feature)
    except TorchXlaNotInstalledError as e:
        print(f"{os.path.basename(script)}: {e}{' ' + hint if hint else ''}", file=sys.stderr)
        raise SystemExit(2) from None


def launch_ranks(script: str, argv: Sequence[str], nproc: int | None = None) -> int:
    """Run ``script argv`` as ``torchrun --standalone --nproc_per_node nproc`` (default: one rank
    per GPU, else `CPU_RANKS` CPU processes); their exit status."""
    nproc = nproc or ranks_to_launch()
    flags = ["--standalone", "--nproc_per_node", str(nproc)]
    where = f"{nproc} GPU processes (nccl)" if torch.cuda.is_available() else f"{nproc} CPU processes (gloo)"
    shown = os.path.relpath(script) if not os.path.relpath(script).startswith("..") else script
    command = " ".join(["torchrun", *flags, shown, *argv])
    print(f"not under torchrun: launching {where}, as: {command}", flush=True)
    env = dict(os.environ, USE_TORCH_XLA="0")  # transformers would import torch_xla wherever it is installed
    with subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *flags, script, *argv], env=env) as ranks:
        try:
            return ranks.wait()
        except KeyboardInterrupt:  # torchrun got the Ctrl-C too and stops the ranks
            return ranks.wait()


INT_FLAG_MAX = 2**31 - 1
"""The largest whole number a number flag takes: a step count, a size or a seed past it is a typo
(torch's sizes and numpy's seeds would overflow with an error of their own)."""


def ranks_to_launch() -> int:
    """The ranks `launch_ranks` starts by default: one per GPU, else `CPU_RANKS` CPU processes (so a
    script can check a flag against them before it launches any)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else CPU_RANKS


def at_least(minimum: int, maximum: int = INT_FLAG_MAX) -> Callable[[str], int]:
    """An argparse type: a whole number from ``minimum`` to ``maximum`` (``-1`` saves-every would
    otherwise read as "every step")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {text[:40]}")
        return value

    return parse


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (a learning rate, a timeout)."""
    value = _number(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0 (a tolerance, a jitter)."""
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of at least 0, got {text}")
    return value


def output_file(text: str) -> Path:
    """An argparse type: a file this run will write (``--json``), checked before the run rather
    than after it: not a directory or a special file, in a directory that exists (or can be made)
    and takes new files."""
    if not text or "\x00" in text:
        raise argparse.ArgumentTypeError(f"expected a file path, got {text!r}")
    target = Path(text)
    if target.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path (e.g. {target / 'report.json'})")
    if target.exists() and not target.is_file():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a regular file; give another path")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:  # the nearest directory that exists
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK) or _read_only(parent):
        raise argparse.ArgumentTypeError(f"cannot create files in the directory {parent}; give a path you can write")
    return target


def output_dir(text: str) -> Path:
    """An argparse type: a directory this run will write into (``--checkpoint-dir``,
    ``--output-dir``), checked before the run: not a file, and the directory (or the nearest one
    above it that exists, where it will be made) takes new files."""
    if not text or "\x00" in text:
        raise argparse.ArgumentTypeError(f"expected a directory path, got {text!r}")
    target = Path(text)
    if target.exists() and not target.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory; give a directory path")
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK) or _read_only(existing):
        raise argparse.ArgumentTypeError(f"cannot create files in the directory {existing}; give a path you can write")
    return target


def _read_only(directory: Path) -> bool:
    """Whether ``directory`` is on a file system that takes no new files (``/proc``, ``/sys``; root
    passes ``os.access`` there)."""
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY) or str(directory.resolve()).startswith(
            ("/proc", "/sys")
        )
    except OSError:
        return True
