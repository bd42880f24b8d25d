"""`read_regular_file`: read a small file a user named, refusing anything that is not one.

The one home of the check the product makes before it reads a path it was given (a config, a
checkpoint's ``LATEST`` and index): the path must be a regular file (not a FIFO, which would
block the read forever, a device, or a directory), checked on the opened descriptor (opened
without blocking), within a size bound; optionally not a symbolic link. A refusal is the caller's
error type with a message that names the path and never shows the file's bytes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["read_regular_file"]


def read_regular_file(
    path: str | os.PathLike[str], *, limit: int, what: str, error: type[Exception], follow_links: bool = True
) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (``what`` names it in
    messages). Raises ``error`` for a missing path, a FIFO, device or directory, a larger file,
    a symbolic link when not ``follow_links``, or a read failure."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise error(f"{path} is a symbolic link; {what} must be a regular file here, not a link.") from None
        if e.errno == errno.ENOENT:
            raise error(f"{what} {path} does not exist.") from None
        raise error(f"Cannot open {what} {path} ({e.strerror}).") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(info.st_mode)
                else "a FIFO"
                if stat.S_ISFIFO(info.st_mode)
                else "not a regular file"
            )
            raise error(f"{what} {path} is {kind}; it must be a regular file. It was not read.")
        if info.st_size > limit:
            raise error(f"{what} {path} has {info.st_size} bytes, more than {limit}; it was not read.")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    except OSError as e:
        raise error(f"Cannot read {what} {path} ({e.strerror}).") from None
    finally:
        os.close(fd)
