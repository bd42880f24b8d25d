"""Which versions of a checkpoint directory a save may remove: those of its own lineage.

A lineage is a random id (32 hex digits) that every save records in its version's
``index.json`` (and, first of all, in its temp directory's ``.lineage``, so that what a killed
save left can be told apart from another run's save in progress). A process continues the lineage
of a directory it loaded from (`load_sharded`: the lineage of the version it loaded) or saved
into before; otherwise its first save there starts a new one. A save removes only versions and
temp files whose record is its lineage: never what another run or another model wrote into the
same directory, nor a version from before lineages were recorded (no ``lineage`` in its index),
nor anything it cannot read. A save also refuses to re-point ``LATEST`` away from another
lineage's version: that run's resume would load this model. A run restarted from its checkpoint
(``torchrun --max-restarts``) loads it first, and so goes on with its own lineage.

The record is per process, keyed by the directory's real path, and holds only the ids. It is
the one module-level state of the checkpoint package, and must be: a lineage names a run, which
outlives any one call and any one model object (a run rebuilds or re-wraps its model, the Hugging
Face trainer saves one wrapper and loads another), and a process is what a run is. It is not a
scoped context because nothing scopes a run more narrowly than its process.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from pathlib import Path

__all__ = ["continues", "is_lineage", "lineage_for_save", "remember_lineage"]

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
    """After a load from ``root`` (or a save whose lineage rank 0 chose): this process's saves
    there continue ``lineage`` (a version from before lineages were recorded has none, and then
    nothing is remembered)."""
    if is_lineage(lineage):
        with _lock:
            _by_root[os.path.realpath(root)] = lineage


def continues(lineage: object) -> bool:
    """Whether this process continues ``lineage`` in some directory: it loaded that run's state
    (the Hugging Face trainer resumes from ``checkpoint-5`` and saves ``checkpoint-10``)."""
    with _lock:
        return lineage in _by_root.values()
