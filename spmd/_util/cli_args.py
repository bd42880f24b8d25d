"""Argument types for the command lines (``spmd.inspector``, ``spmd.plan``, ``fsdp_xla.consolidate``):
every count, size and path is checked when argparse parses it, so a bad flag is one ``error:``
line and exit code 2, before any runtime or compiler starts."""

from __future__ import annotations

import argparse
import functools
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["finite_float", "int_in", "input_file", "output_dir", "output_file"]

_MAX_DIGITS = 18  # a count or size beyond 10**18 is a typo, and int() of 4300+ digits raises


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high`` (inclusive; no bound when ``None``)."""

    def parse(text: str) -> int:
        stripped = text.strip().lstrip("+-")
        if not stripped.isdigit():
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number")
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        if len(stripped.lstrip("0")) > _MAX_DIGITS:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is too large: give a whole number {bound}")
        value = int(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: give a whole number {bound}")
        return value

    return parse


def finite_float(low: float, high: float | None = None, *, open_low: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number above (``open_low``) or at least ``low``, at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number")
        if value < low or (open_low and value == low) or (high is not None and value > high):
            bound = f"{'above' if open_low else 'at least'} {low}" + (
                f" and at most {high}" if high is not None else ""
            )
            raise argparse.ArgumentTypeError(f"{value} is out of range: give a number {bound}")
        return value

    return parse


def _os_errors_named(check: Callable[[str], Path]) -> Callable[[str], Path]:
    """``check`` as an argparse type whose ``OSError`` (a name too long for the file system, ...)
    is a usage error naming the path."""

    @functools.wraps(check)
    def parse(text: str) -> Path:
        try:
            return check(text)
        except OSError as e:
            raise argparse.ArgumentTypeError(f"{text[:80]!r}: {e.strerror}") from None

    return parse


@_os_errors_named
def input_file(text: str) -> Path:
    """An argparse type: an existing regular file (not a directory, FIFO or device)."""
    path = Path(text)
    if "\x00" in text:
        raise argparse.ArgumentTypeError("the path holds a NUL character")
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a regular file")
    return path


@_os_errors_named
def output_file(text: str) -> Path:
    """An argparse type: a file to write: not an existing directory or special file, in an
    existing, writable directory."""
    path = Path(text)
    if "\x00" in text or not text:
        raise argparse.ArgumentTypeError("give a file path")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path (e.g. {path / 'report.json'})")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a regular file")
    _check_writable_dir(path.parent if str(path.parent) else Path("."))
    return path


def _check_writable_dir(parent: Path) -> None:
    """``parent`` is a directory a file can be created in. Tried, not judged by ``os.access``:
    root passes that check for /proc and read-only mounts, and the write then fails after the
    work is done."""
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"the directory {parent} does not exist")
    try:
        fd, name = tempfile.mkstemp(dir=parent, prefix=".write-test-")
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot create files in the directory {parent} ({e.strerror})") from None
    os.close(fd)
    os.unlink(name)


@_os_errors_named
def output_dir(text: str) -> Path:
    """An argparse type: a directory to write into: an existing directory, or a new path whose
    parent exists (not an existing file)."""
    path = Path(text)
    if "\x00" in text or not text:
        raise argparse.ArgumentTypeError("give a directory path")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    if not path.exists():
        _check_writable_dir(path.parent if str(path.parent) else Path("."))
    return path
