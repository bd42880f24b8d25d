"""Which versions of a checkpoint directory a save may remove: those of its own lineage.

A lineage is a random id (32 hex digits) that every save records in its version's
``index.json``. A process continues the lineage of a directory it loaded from (`load_sharded`:
the lineage of the version it loaded) or saved into before; otherwise its first save there
starts a new one. A save removes only versions whose index records its lineage: never a version
another run or another model wrote into the same directory, nor one from before lineages were
recorded (no ``lineage`` in its index), nor anything it cannot read as an index. A run restarted
from its checkpoint (``torchrun --max-restarts``) loads it first, and so goes on pruning its own
versions.

The record is per process and keyed by the directory's real path; it holds no file and no
tensor, only the ids.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from pathlib import Path

__all__ = ["is_lineage", "lineage_for_save", "remember_lineage"]

_LINEAGE = re.compile(r"[0-9a-f]{32}")
_lock = threading.Lock()
_by_root: dict[str, str] = {}  # real path of a checkpoint directory -> the lineage this process continues


def is_lineage(value: object) -> bool:
    """Whether ``value`` is a lineage id as a save records it."""
    return isinstance(value, str) and _LINEAGE.fullmatch(value) is not None


def lineage_for_save(root: Path) -> str:
    """The lineage a save into ``root`` records: the one this process continues there, or a new one."""
    with _lock:
        return _by_root.setdefault(os.path.realpath(root), uuid.uuid4().hex)


def remember_lineage(root: Path, lineage: object) -> None:
    """After a load from ``root``: this process's saves there continue ``lineage`` (a version from
    before lineages were recorded has none, and then nothing is remembered)."""
    if is_lineage(lineage):
        with _lock:
            _by_root[os.path.realpath(root)] = lineage
