"""`atomic_write`: write a file so that its name never shows a half-written file.

The one home of the pattern the checkpoint, the consolidation CLI and the inspector's JSON use:
write to a temp file in the same directory, flush it to disk, then rename it over the target
(a rename within a directory is atomic). A crash or an error leaves the old file, or none.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_write", "file_to_write"]


def file_to_write(path: object, what: str) -> Path:
    """``path`` as a Path, checked before any work that ends in writing it: not a directory or a
    special file (FIFO, device), and its parent directory made. ``what`` names the caller.

    Raises:
        TypeError: not a path.
        ValueError: a directory or special file is there, or the parent cannot be made.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path) or "\x00" in str(path):
        raise TypeError(f"{what} takes a file path, got {type(path).__name__} {path!r:.60}.")
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{what}: {target} is a directory; give a file path (e.g. {target / 'report.json'}).")
    if target.exists() and not target.is_file():
        raise ValueError(f"{what}: {target} exists and is not a regular file; give another path.")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{what}: cannot create the directory {target.parent} ({e.strerror}).") from None
    return target


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``path``; when the block ends without an error, it is synced
    and renamed to ``path``. On an error it is removed and ``path`` is untouched.

    Example:
        >>> import json, tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "report.json"
        >>> with atomic_write(target) as tmp:
        ...     _ = tmp.write_text(json.dumps({"ok": True}))
        >>> json.loads(target.read_text())
        {'ok': True}
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        # mkstemp makes the file 0600; the result keeps the mode the target had, else 0644
        # (a checkpoint or report on shared storage must be readable by the others).
        os.chmod(tmp, target.stat().st_mode & 0o777 if target.exists() else 0o644)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
