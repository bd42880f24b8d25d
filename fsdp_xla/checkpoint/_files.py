"""The files of a checkpoint directory: the lock, ``LATEST``, version directories, ``index.json``
and the device files, written atomically and read without leaving the checkpoint.

Inside the checkpoint root nothing is followed through a symbolic link: ``LATEST``, a version
directory, its ``index.json`` and its device files must each be what they seem (a regular file,
a directory), or they are refused before they are opened for reading. The root itself may be a
link (a mounted volume). Small files are read with a size bound and without blocking (a FIFO
named ``LATEST`` does not hang a load), and an error never shows the bytes of a file that has
not been validated.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fsdp_xla.checkpoint._arguments import check_path
from fsdp_xla.checkpoint._format import CheckpointIndex, check_version_name, is_version_name, parse_index, version_name
from fsdp_xla.checkpoint._lineage import continues, is_lineage, remember_lineage
from fsdp_xla.errors import CheckpointError
from spmd.files import atomic_write, read_regular_file

__all__ = [
    "FILE_MODE",
    "INDEX",
    "LATEST",
    "Reader",
    "checkpoint_version",
    "commit",
    "has_checkpoint",
    "is_disk_full",
    "lineage_record",
    "locked",
    "new_version_name",
    "prune",
    "read_index",
    "refuse_foreign_latest",
    "start_version",
    "write_device_file",
    "write_index",
]

INDEX = "index.json"
LATEST = "LATEST"
_LOCK = ".lock"
_PARTIAL_LINEAGE = ".lineage"  # in a save's temp directory: whose it is
FILE_MODE = 0o644
"""The mode of every file a save writes (docs/fsdp.md): readable by all, written by the owner."""
_DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_MAX_LATEST_BYTES = 256  # a version name and a newline
_MAX_INDEX_BYTES = 1 << 30


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_device_file(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """One device's blocks as a safetensors file, synced, mode `FILE_MODE` (safetensors creates
    its files 0600)."""
    from safetensors.torch import save_file

    save_file(tensors, str(path))
    os.chmod(path, FILE_MODE)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_index(work: Path, meta: dict[str, Any]) -> None:
    """The version's index.json, synced, then the directory synced: all before the commit."""
    fd = os.open(work / INDEX, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(work)


def new_version_name() -> str:
    return version_name(time.strftime("%Y%m%dT%H%M%S", time.gmtime()), uuid.uuid4().hex[:8])


def start_version(root: Path, version: str, lineage: str) -> tuple[Path, str]:
    """The temp directory of a save of ``lineage``, with its ``.lineage`` record written first:
    what a killed save leaves is then removed by its own lineage's next save, and no other's."""
    lineage = refuse_foreign_latest(root, lineage)
    work = root / f".{version}.partial"
    work.mkdir()
    fd = os.open(work / _PARTIAL_LINEAGE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(lineage)
    return work, lineage


def refuse_foreign_latest(root: Path, lineage: str) -> str:
    """The lineage a save into ``root`` records: ``lineage``, or the one ``LATEST``'s version
    records if this process continues it elsewhere (it loaded that run's state). Refuse to
    replace a ``LATEST`` that names another lineage's version: that run's resume would load this
    model. A version from before lineages were recorded is not provably another run's."""
    try:
        version = checkpoint_version(root)
    except CheckpointError:
        return lineage  # no LATEST, or one naming nothing complete: nothing a resume could load
    theirs = _lineage_of(version)
    if theirs is not None and theirs != lineage and continues(theirs):
        remember_lineage(root, theirs)  # this run's own directory, written before a restart
        return theirs
    if theirs is not None and theirs != lineage:
        raise CheckpointError(
            f"{root} holds another run's checkpoint ({root / LATEST} names {version.name}, of lineage {theirs}; this "
            f"model's saves there are of lineage {lineage}). Saving would make that run resume from this model. "
            "Save to another directory; or, to continue that run, load_sharded from it first. Nothing was written."
            + _several_ranks_hint()
        )
    return lineage


def _several_ranks_hint() -> str:
    """Under a process group of several ranks, the likelier cause: a model with no DTensor is
    saved whole by each rank (no collective), and a sibling rank's save came first."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return ""
    return (
        f" Under this process group of {dist.get_world_size()} ranks, the other run may be another rank of this job: "
        "a model without DTensors (not sharded) is whole on every rank and each rank's save writes it; save it from "
        "one rank only (if dist.get_rank() == 0), or shard it (fsdp_xla.fully_shard) so that every rank writes its part."
    )


def commit(root: Path, work: Path, version: str, lineage: str) -> None:
    """Make the written version ``work`` the checkpoint: rename it, then replace ``LATEST``."""
    (work / _PARTIAL_LINEAGE).unlink()  # its index records the lineage now (`_partial_lineage`)
    os.rename(work, root / version)
    _fsync_dir(root)
    try:
        with atomic_write(root / LATEST, tag=lineage) as tmp:  # its rename is the commit point
            tmp.write_text(version + "\n")
    except BaseException:
        shutil.rmtree(root / version, ignore_errors=True)  # never made visible by LATEST
        raise
    _fsync_dir(root)


def lineage_record(root: Path, lineage: str) -> dict[str, Any]:
    """What a version's index records of its lineage (under the lock, before the commit): the
    ``lineage`` and its ``sequence``, one more than the highest of that lineage's versions in
    ``root``. `prune` orders a lineage's versions by it: file times move (a copy, a backup
    restore, a ``touch``), a version's place in its run does not."""
    sequences = [record[1] for record in map(_record_of, _version_dirs(root)) if record[0] == lineage]
    return {"lineage": lineage, "sequence": max((n for n in sequences if n is not None), default=0) + 1}


def prune(root: Path, version: str, keep: int, lineage: str) -> None:
    """Remove all but the newest ``keep`` versions of ``lineage``, and what killed saves left
    (under the lock).

    Only what this checkpoint's own saves wrote is removed: version directories (a writer's name,
    holding an index.json) whose index records ``lineage`` (`fsdp_xla.checkpoint._lineage`), and
    the temp files of this lineage's killed saves (recorded in their ``.lineage``, or named by
    it). A version of another lineage, one from before lineages were recorded,
    one whose index cannot be read, and anything else in the directory stay. Versions are ordered
    by the ``sequence`` their index records (`lineage_record`), never by file times; a version
    saved before sequences were recorded comes before every sequenced one, by its name (the UTC
    second it was saved). A version whose sequence is not a whole number is kept."""
    ordered: list[tuple[int, str, Path]] = []
    for path in _version_dirs(root):
        theirs, sequence = _record_of(path)
        if path.name != version and theirs == lineage and sequence != _UNREADABLE:
            ordered.append((sequence or 0, path.name, path))
    for _, _, old in sorted(ordered)[: max(0, len(ordered) + 1 - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    for partial in root.glob(".v-*.partial"):  # saves of this lineage killed while writing
        if is_version_name(partial.name[1 : -len(".partial")]) and _partial_lineage(partial) == lineage:
            shutil.rmtree(partial, ignore_errors=True)
    for stale in root.glob(f".{LATEST}.{lineage}.*.tmp"):  # a save of this lineage killed while replacing LATEST
        stale.unlink(missing_ok=True)


def _partial_lineage(partial: Path) -> str | None:
    """The lineage recorded in a save's temp directory; None if it is not one or records none."""
    if partial.is_symlink() or not partial.is_dir():
        return None
    if not (partial / _PARTIAL_LINEAGE).exists() and (partial / INDEX).is_file():
        return _lineage_of(partial)  # killed between dropping the record and the rename
    try:
        text = _read_regular_file(partial / _PARTIAL_LINEAGE, 64, "a lineage record").decode("ascii").strip()
    except (CheckpointError, UnicodeDecodeError):
        return None
    return text if is_lineage(text) else None


def _version_dirs(root: Path) -> list[Path]:
    """The version directories in ``root``: a writer's name, no link, holding an index.json."""
    return [
        p
        for p in root.iterdir()
        if is_version_name(p.name) and not p.is_symlink() and p.is_dir() and (p / INDEX).is_file()
    ]


def _lineage_of(version: Path) -> str | None:
    """The lineage ``version``'s index records; None if it records none or cannot be read."""
    return _record_of(version)[0]


_UNREADABLE = -1  # a sequence that is there but not a whole number >= 1 (an edited index)


def _record_of(version: Path) -> tuple[str | None, int | None]:
    """(lineage, sequence) of ``version``'s index: None for what it does not record (a version
    from before lineages or sequences), lineage None when the index cannot be read, and
    sequence `_UNREADABLE` when it is recorded but is not a whole number >= 1."""
    try:
        meta = json.loads(_read_regular_file(version / INDEX, _MAX_INDEX_BYTES, "an index"))
    except (CheckpointError, ValueError, RecursionError):
        return None, None
    if not isinstance(meta, dict) or not is_lineage(meta.get("lineage")):
        return None, None
    sequence = meta.get("sequence")
    if sequence is not None and (type(sequence) is not int or sequence < 1):
        sequence = _UNREADABLE
    return meta["lineage"], sequence


def has_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a checkpoint to resume from: True if ``path/LATEST`` exists, False
    if ``path`` holds no version (missing, empty, or only other files and a killed first save's
    temp files).

    Raises:
        CheckpointError: ``path`` holds versions but no ``LATEST``: nothing says which version is
            complete, nor whose they are, so neither a resume nor a fresh start is safe there.
    """
    root = check_path("has_checkpoint", path)
    if (root / LATEST).exists() or (root / LATEST).is_symlink():
        return True
    if not root.is_dir():
        return False
    versions = sorted(p.name for p in _version_dirs(root))
    if not versions:
        return False
    shown = ", ".join(versions[:3]) + (f" and {len(versions) - 3} more" if len(versions) > 3 else "")
    raise CheckpointError(
        f"{root} holds {len(versions)} checkpoint version(s) ({shown}) but no {LATEST}: nothing says which is "
        "complete, nor which run wrote them, so it is neither loaded nor resumed from. Give another checkpoint "
        f"directory; or, if these versions are yours, restore {LATEST} (write a complete version's name into it) "
        "or remove them yourself."
    )


def is_disk_full(e: BaseException) -> bool:
    """An OSError for a full disk or a file size limit; safetensors reports its own as text."""
    if isinstance(e, OSError) and e.errno in _DISK_FULL:
        return True
    text = str(e)
    return any(f"os error {code}" in text for code in _DISK_FULL) or "No space left" in text or "too large" in text


@contextlib.contextmanager
def locked(root: Path, *, shared: bool) -> Iterator[None]:
    """Hold ``root/.lock``: exclusive while saving, shared while loading. A checkpoint on a
    read-only location, or whose ``.lock`` is a link or a directory, is read without the lock:
    no save can take it there either. A save refuses such a ``.lock``."""
    try:
        fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    except OSError as e:
        if shared:  # read-only, or a .lock no save can take either: nobody writes here meanwhile
            yield
            return
        if e.errno in (errno.ELOOP, errno.EISDIR) or (root / _LOCK).is_symlink():
            kind = "a symbolic link" if (root / _LOCK).is_symlink() else "a directory"
            raise CheckpointError(
                f"{root / _LOCK} is {kind}; the lock file must be a regular file (no link inside the checkpoint "
                "is followed). Remove it; the next save recreates it. Nothing was written."
            ) from None
        raise CheckpointError(f"Cannot lock {root} for saving: {root / _LOCK}: {e.strerror}.") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_regular_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``: a regular file inside the checkpoint, not a link (`read_regular_file`)."""
    return read_regular_file(path, limit=limit, what=what, error=CheckpointError, follow_links=False)


def _refuse_link(path: Path, what: str) -> None:
    if path.is_symlink():
        raise CheckpointError(f"{path} is a symbolic link; {what} inside the checkpoint are never followed.")


def checkpoint_version(path: str | os.PathLike[str]) -> Path:
    """The complete version directory ``path/LATEST`` names.

    Raises:
        CheckpointError: no checkpoint there (or versions but no ``LATEST``: `has_checkpoint`);
            ``LATEST`` is a link, not a regular file, or names anything but a version directory
            of this checkpoint; that version is a link, or has no regular ``index.json``.
    """
    root = check_path("checkpoint_version", path)
    latest = root / LATEST
    if not latest.exists() and not latest.is_symlink():
        has_checkpoint(root)  # versions but no LATEST: raises, saying what is there
        raise CheckpointError(f"No sharded checkpoint at {root}: {latest} does not exist.")
    text = _read_regular_file(latest, _MAX_LATEST_BYTES, "LATEST").decode("utf-8", errors="replace")
    version = root / check_version_name(text, latest)
    _refuse_link(version, "version directories")
    if not version.is_dir():
        raise CheckpointError(f"{latest} names {version.name}, which is not a directory: the checkpoint is damaged.")
    index = version / INDEX
    _refuse_link(index, "index files")
    if not index.is_file():
        raise CheckpointError(f"{latest} names {version.name}, which has no {INDEX}: the checkpoint is damaged.")
    return version


def read_index(version: Path) -> CheckpointIndex:
    """The version's index, parsed and checked entry by entry (and every device file it names: a
    regular file of the version, no link) before any tensor is read."""
    raw = _read_regular_file(version / INDEX, _MAX_INDEX_BYTES, "an index")
    try:
        meta = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{version / INDEX} is not valid JSON ({e}): the checkpoint is damaged.") from None
    except RecursionError:
        raise CheckpointError(
            f"{version / INDEX} nests too deeply to be an index: the checkpoint is damaged."
        ) from None
    index = parse_index(meta, version / INDEX)
    for file in index.files():
        path = version / file
        _refuse_link(path, "device files")
        if not path.exists():
            raise CheckpointError(f"{version / INDEX} names {file!r}, which is missing: the checkpoint is damaged.")
        if not path.is_file():
            raise CheckpointError(f"{path} is not a regular file; a device file must be one. It is not read.")
    return index


class Reader:
    """Reads blocks from a version's safetensors files, opening each once."""

    def __init__(self, version: Path) -> None:
        self.version = version
        self._open: dict[str, Any] = {}

    def block(self, file: str, name: str) -> torch.Tensor:
        """Block ``name`` of device file ``file`` (a name `read_index` checked)."""
        from safetensors import SafetensorError, safe_open

        path = self.version / file
        try:
            if file not in self._open:
                self._open[file] = safe_open(str(path), framework="pt")
            return self._open[file].get_tensor(name)
        except (SafetensorError, OSError, KeyError) as e:
            raise CheckpointError(f"Cannot read {name!r} from {path}: {e}. The checkpoint is damaged.") from None
