"""Sharded checkpoints: each device's shards in safetensors files, a JSON index, atomic saves.

Layout of a checkpoint directory::

    ckpt/
      LATEST                      the name of the complete version below (replaced atomically)
      v-20261122T081500-3f2a9c1e/
        index.json                every tensor: global shape, dtype, where each block lives
        device-00000.safetensors  the blocks device 0 holds (one copy of each replicated block)
        ...

A save writes a new version directory, syncs it to disk, then replaces ``LATEST`` with a
rename, the one atomic step; older versions are removed after. A save killed at any point, or
stopped by a full disk (then a `CheckpointError`), leaves ``LATEST`` naming the previous
complete version. Saves into one directory take an exclusive lock on ``<dir>/.lock`` and so run
one after the other; loads take it shared, so no version is removed while it is being read.

Loading reads only safetensors and JSON (no pickle, so no code runs), and only files inside the
checkpoint: ``LATEST`` and every file named in ``index.json`` must be names the writer makes, and
the whole index is checked before any tensor is read (`fsdp_xla._checkpoint_format`). Each
tensor is assembled on the host and laid out as the model's current sharding, so a checkpoint
saved on 8 devices loads on 4 (or on any mesh).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fsdp_xla._checkpoint_dtensor import agree, broadcast, distributed, dtensor_block, is_dtensor, place_dtensor
from fsdp_xla._checkpoint_format import (
    FORMAT,
    check_index,
    check_version_name,
    checksum,
    device_file_name,
    is_version_name,
    version_name,
)
from fsdp_xla.errors import CheckpointError, CheckpointTypeError
from spmd._backend import backend
from spmd.atomic_file import atomic_write
from spmd.hlo_sharding import HloSharding

__all__ = ["save_sharded", "load_sharded", "consolidate", "checkpoint_version", "FORMAT"]

_INDEX = "index.json"
_LATEST = "LATEST"
_LOCK = ".lock"
_DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class _Block:
    device: int
    index: tuple[tuple[int, int], ...]
    data: torch.Tensor


def _blocks(t: torch.Tensor) -> list[_Block]:
    """One host copy of each distinct block of ``t`` (replicas are written once); ``t`` must
    hold data already (`save_sharded` computes all pending tensors in one graph first)."""
    if not backend.is_xla_tensor(t):
        return [_Block(0, tuple((0, n) for n in t.shape), t.detach().cpu().contiguous())]
    sharding = backend.sharding_of(t) or HloSharding.replicated()
    shards = backend.local_shards(t)
    bounds = {b.device: b for b in sharding.shard_bounds(tuple(t.shape), [d for d, _ in shards])}
    out = []
    for device, padded in shards:
        b = bounds[device]
        if b.replica_id != 0:
            continue
        data = padded[tuple(slice(0, n) for n in b.shape)].contiguous()
        out.append(_Block(device, tuple((s.start, s.stop) for s in b.index), data))
    return out


def _named_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict, dict, dict]:
    """(tensors by checkpoint name, aliases {name: name it shares storage with}, optimizer JSON)."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[int, str] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        key = f"model/{name}"
        if id(t) in seen:
            aliases[key] = seen[id(t)]
            continue
        seen[id(t)] = key
        tensors[key] = t
    optim_json: dict[str, Any] = {}
    if optimizer is not None:
        names = {id(p): n for n, p in model.named_parameters()}
        state = optimizer.state_dict()
        index_to_name = {}
        groups = []
        flat = [p for g in optimizer.param_groups for p in g["params"]]
        for i, p in enumerate(flat):
            if id(p) not in names:
                raise CheckpointError(
                    f"The optimizer holds a parameter of shape {tuple(p.shape)} that the model does not: build "
                    "the optimizer from this model's parameters (after wrapping it with FSDP)."
                )
            index_to_name[i] = names[id(p)]
        for group in state["param_groups"]:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = [index_to_name[i] for i in group["params"]]
            groups.append(g)
        scalars: dict[str, dict[str, Any]] = {}
        for i, pstate in state["state"].items():
            pname = index_to_name[i]
            for key, value in pstate.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optim/{pname}/{key}"] = value
                else:
                    scalars.setdefault(pname, {})[key] = value
        optim_json = {"param_groups": groups, "scalars": scalars}
    return tensors, aliases, optim_json


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_device_file(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path))
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def save_sharded(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    extra: dict[str, Any] | None = None,
    keep: int = 1,
) -> Path:
    """Save ``model`` (and ``optimizer``) as per-device shards under ``path``, atomically.

    Args:
        path: the checkpoint directory (created if needed).
        model: the model, FSDP-wrapped or not; names are its ``state_dict()`` keys.
        optimizer: its optimizer; state is saved by parameter name, sharded like the params.
        extra: JSON-serializable values to keep beside (step, epoch, ...).
        keep: complete versions to keep (the newest ``keep``; at least 1).

    Returns:
        The version directory written.
    """
    _check_arguments("save_sharded", path, model, optimizer)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise CheckpointError(f"save_sharded: keep must be an int >= 1 (versions to keep), got {keep!r}.")
    try:
        json.dumps(extra or {})
    except (TypeError, ValueError) as e:
        raise CheckpointTypeError(
            f"save_sharded: extra={extra!r} is not JSON-serializable ({e}); give plain numbers and strings "
            "(e.g. {'step': int(step)}, not a tensor). Nothing was written."
        ) from None
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"save_sharded: {root} is a file; a checkpoint is a directory. Give another path.")
    root.mkdir(parents=True, exist_ok=True)
    tensors, aliases, optim_json = _named_tensors(model, optimizer)
    if distributed(tensors):
        return _save_distributed(root, tensors, aliases, optim_json, extra, keep)
    pending = [t for t in tensors.values() if backend.is_xla_tensor(t)]
    if pending:
        backend.sync_tensors(pending)
    with _locked(root, shared=False):
        version = _new_version_name()
        work = root / f".{version}.partial"
        work.mkdir()
        try:
            _write_version(work, tensors, aliases, optim_json, extra)
            _commit(root, work, version)
        except BaseException as e:
            shutil.rmtree(work, ignore_errors=True)
            if _is_disk_full(e):
                raise CheckpointError(
                    f"Saving to {root} failed, the disk is full or a file size limit was hit ({e}). Nothing of "
                    f"this save remains; {root / _LATEST} still names the previous checkpoint. Free space and "
                    "save again."
                ) from e
            raise
        _prune(root, version, keep)
    return root / version


def _check_arguments(what: str, path: object, model: object, optimizer: object) -> None:
    """TypeErrors naming the argument, before anything is read or written."""
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointTypeError(
            f"{what}: path must be a str or os.PathLike (the checkpoint directory), got {path!r}."
        )
    if not isinstance(model, torch.nn.Module):
        hint = " (model and optimizer swapped?)" if isinstance(model, torch.optim.Optimizer) else ""
        raise CheckpointTypeError(
            f"{what}: model must be an nn.Module, got {type(model).__name__}{hint}. Pass the model itself, not its "
            "state_dict()."
        )
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise CheckpointTypeError(
            f"{what}: optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}."
        )


def _new_version_name() -> str:
    return version_name(time.strftime("%Y%m%dT%H%M%S", time.gmtime()), uuid.uuid4().hex[:8])


def _write_index(work: Path, meta: dict[str, Any]) -> None:
    """The version's index.json, synced, then the directory synced: all before the commit."""
    with open(work / _INDEX, "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(work)


def _commit(root: Path, work: Path, version: str) -> None:
    """Make the written version ``work`` the checkpoint: rename it, then replace ``LATEST``."""
    os.rename(work, root / version)
    _fsync_dir(root)
    try:
        with atomic_write(root / _LATEST) as tmp:  # its rename is the commit point
            tmp.write_text(version + "\n")
    except BaseException:
        shutil.rmtree(root / version, ignore_errors=True)  # never made visible by LATEST
        raise
    _fsync_dir(root)


def _prune(root: Path, version: str, keep: int) -> None:
    """Remove all but the newest ``keep`` versions, and what killed saves left (under the lock).

    Only what a save writes is touched: version directories (a writer's name, holding an
    index.json) and the save's temp files; anything else in the directory stays. Versions are
    ordered by when their index was written (several saves in one second included)."""
    versions = [p for p in root.iterdir() if p.is_dir() and is_version_name(p.name) and (p / _INDEX).is_file()]
    versions.sort(key=lambda p: ((p / _INDEX).stat().st_mtime_ns, p.name))
    for old in [v for v in versions if v.name != version][: max(0, len(versions) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    for partial in root.glob(".v-*.partial"):
        if is_version_name(partial.name[1 : -len(".partial")]):
            shutil.rmtree(partial, ignore_errors=True)
    for stale in root.glob(f".{_LATEST}.*.tmp"):  # a save killed while replacing LATEST
        stale.unlink(missing_ok=True)


def _save_distributed(
    root: Path, tensors: dict[str, torch.Tensor], aliases: dict, optim_json: dict, extra: dict | None, keep: int
) -> Path:
    """`save_sharded` of a DTensor model: each rank writes its blocks, rank 0 commits."""
    import torch.distributed as dist

    rank = dist.get_rank()
    lock = _locked(root, shared=False) if rank == 0 else contextlib.nullcontext()
    with lock:
        version = broadcast(_new_version_name() if rank == 0 else None)
        work = root / f".{version}.partial"
        if rank == 0:
            work.mkdir()
        dist.barrier()
        mine: dict[str, torch.Tensor] = {}
        entries: dict[str, list] = {}
        error = ""
        try:
            for name, t in tensors.items():
                if is_dtensor(t):
                    block = dtensor_block(t)
                elif rank == 0:  # the same plain tensor on every rank: rank 0 writes it
                    block = (0, tuple((0, n) for n in t.shape), t.detach().cpu().contiguous())
                else:
                    block = None
                if block is not None:
                    mine[name] = block[2]
                    entries[name] = [
                        {
                            "file": device_file_name(block[0]),
                            "index": [list(b) for b in block[1]],
                            "crc32": checksum(block[2]),
                        }
                    ]
            if mine:
                _write_device_file(work / device_file_name(rank), mine)
        except Exception as e:  # every rank must reach the agreement below, or the others wait forever
            error = f"rank {rank}: {type(e).__name__}: {e}"
        reports = agree((error, entries))
        errors = [e for e, _ in reports if e]
        if errors:
            if rank == 0:
                shutil.rmtree(work, ignore_errors=True)
            full = any(_is_disk_full(OSError(e)) for e in errors)
            kind = "the disk is full or a file size limit was hit" if full else "a rank failed to write"
            raise CheckpointError(
                f"Saving to {root} failed, {kind} ({errors[0]}); LATEST still names the previous checkpoint."
            )
        if rank == 0:
            index: dict[str, Any] = {}
            for name, t in tensors.items():
                blocks = [b for _, rank_entries in reports for b in rank_entries.get(name, [])]
                index[name] = {"shape": list(t.shape), "dtype": _dtype_name(t.dtype), "blocks": blocks}
            meta = {
                "format": FORMAT,
                "tensors": index,
                "aliases": aliases,
                "optimizer": optim_json,
                "extra": extra or {},
            }
            _write_index(work, meta)
            _commit(root, work, version)
            _prune(root, version, keep)
        dist.barrier()
    return root / version


def _write_version(
    work: Path, tensors: dict[str, torch.Tensor], aliases: dict, optim_json: dict, extra: dict | None
) -> None:
    per_device: dict[int, dict[str, torch.Tensor]] = {}
    index: dict[str, Any] = {}
    for name, t in tensors.items():
        entry = {"shape": list(t.shape), "dtype": _dtype_name(t.dtype), "blocks": []}
        for block in _blocks(t):
            per_device.setdefault(block.device, {})[name] = block.data
            entry["blocks"].append(
                {"file": device_file_name(block.device), "index": block.index, "crc32": checksum(block.data)}
            )
        index[name] = entry
    for device, content in sorted(per_device.items()):
        _write_device_file(work / device_file_name(device), content)
    _write_index(
        work, {"format": FORMAT, "tensors": index, "aliases": aliases, "optimizer": optim_json, "extra": extra or {}}
    )


def _is_disk_full(e: BaseException) -> bool:
    """An OSError for a full disk or a file size limit; safetensors reports its own as text."""
    if isinstance(e, OSError) and e.errno in _DISK_FULL:
        return True
    text = str(e)
    return any(f"os error {code}" in text for code in _DISK_FULL) or "No space left" in text or "too large" in text


@contextlib.contextmanager
def _locked(root: Path, *, shared: bool) -> Iterator[None]:
    """Hold ``root/.lock``: exclusive while saving, shared while loading. A checkpoint on a
    read-only location is read without the lock (nobody can write there)."""
    try:
        fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        if not shared:
            raise
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def checkpoint_version(path: str | os.PathLike[str]) -> Path:
    """The complete version directory ``path/LATEST`` names.

    Raises:
        CheckpointError: no checkpoint there, or ``LATEST`` names anything but a version
            directory of this checkpoint (a path outside it included), or a missing one.
    """
    root = Path(path)
    latest = root / _LATEST
    if not latest.is_file():
        raise CheckpointError(f"No sharded checkpoint at {root}: {latest} does not exist.")
    version = root / check_version_name(latest.read_text(errors="replace"), latest)
    if version.resolve().parent != root.resolve():  # a version directory that is a link elsewhere
        raise CheckpointError(f"{latest} names {version.name}, which links outside {root}; it is not read.")
    if not (version / _INDEX).is_file():
        raise CheckpointError(f"{latest} names {version.name}, which has no {_INDEX}: the checkpoint is damaged.")
    return version


def _read_index(version: Path) -> dict[str, Any]:
    """The version's index, checked entry by entry before any tensor is read."""
    try:
        meta = json.loads((version / _INDEX).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{version / _INDEX} is not valid JSON ({e}): the checkpoint is damaged.") from e
    except RecursionError as e:
        raise CheckpointError(f"{version / _INDEX} nests too deeply to be an index: the checkpoint is damaged.") from e
    check_index(meta, version / _INDEX)
    inside = version.resolve()
    for file in sorted({b["file"] for entry in meta["tensors"].values() for b in entry["blocks"]}):
        path = version / file
        if path.resolve().parent != inside:  # a link out of the checkpoint: refused before any read
            raise CheckpointError(f"{file!r} is not a file of {version} (it links elsewhere); it is not read.")
        if not path.is_file():
            raise CheckpointError(f"{version / _INDEX} names {file!r}, which is missing: the checkpoint is damaged.")
    return meta


class _Reader:
    """Reads blocks from a version's safetensors files, opening each once."""

    def __init__(self, version: Path) -> None:
        self.version = version
        self._open: dict[str, Any] = {}

    def block(self, file: str, name: str) -> torch.Tensor:
        from safetensors import SafetensorError, safe_open

        path = self.version / file
        if path.resolve().parent != self.version.resolve():  # check_index allows plain names only
            raise CheckpointError(f"{file!r} is not a file of {self.version}.")
        try:
            if file not in self._open:
                self._open[file] = safe_open(str(path), framework="pt")
            return self._open[file].get_tensor(name)
        except (SafetensorError, OSError, KeyError) as e:
            raise CheckpointError(f"Cannot read {name!r} from {path}: {e}. The checkpoint is damaged.") from e


def _assemble(reader: _Reader, name: str, entry: dict[str, Any]) -> torch.Tensor:
    shape = tuple(entry["shape"])
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
        raise CheckpointError(f"{name!r} has dtype {entry['dtype']!r}, which this reader does not know.")
    full = torch.empty(shape, dtype=dtype)
    covered = 0
    for block in entry["blocks"]:
        data = reader.block(block["file"], name)
        index = tuple(slice(a, b) for a, b in block["index"])
        expected = tuple(b - a for a, b in block["index"])
        if tuple(data.shape) != expected:
            raise CheckpointError(
                f"{name!r}: the block in {block['file']} has shape {tuple(data.shape)}, the index says {expected}."
            )
        if "crc32" in block and checksum(data) != block["crc32"]:  # checkpoints before checksums have none
            raise CheckpointError(
                f"{name!r}: the block in {reader.version / block['file']} does not have the checksum the index "
                "recorded when it was saved: the file's data is damaged. Restore the checkpoint from a copy, or "
                "load an older version. If this came up during load_sharded, tensors before it were already "
                "loaded: load a complete checkpoint again before training on."
            )
        full[index] = data
        covered += data.numel()
    if covered != full.numel():
        raise CheckpointError(f"{name!r}: the blocks cover {covered} of {full.numel()} elements of shape {shape}.")
    return full


def _place(target: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` (of ``target``'s shape: callers check it from the index first) laid out as ``target``."""
    value = value.to(target.dtype)
    if is_dtensor(target):
        return place_dtensor(target, value)
    if backend.is_xla_tensor(target):
        sharding = backend.sharding_of(target) or HloSharding.replicated()
        return backend.to_device_sharded(value, sharding)
    return value.to(target.device)


def _set(target: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        if is_dtensor(target):  # FSDP2 keeps its parameters' storage: copy into the local block
            target.to_local().copy_(value.to_local())
        else:
            target.data = value


def load_sharded(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    strict: bool = True,
) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``model`` (and ``optimizer``), in place, laid out as
    the model's tensors are now (any mesh, any device count).

    Returns:
        The ``extra`` values saved with it.

    Raises:
        CheckpointError: missing or damaged checkpoint, a missing or unexpected key (when
            ``strict``), or a shape that does not match; the message names the key.
    """
    _check_arguments("load_sharded", path, model, optimizer)
    if not (Path(path) / _LATEST).is_file():  # no checkpoint there: say so, and leave no lock file behind
        checkpoint_version(path)  # raises, naming the path (the version is read under the lock below)
    with _locked(Path(path), shared=True):  # no save removes this version meanwhile
        version = checkpoint_version(path)
        meta = _read_index(version)
        reader = _Reader(version)
        index, aliases = meta["tensors"], meta.get("aliases", {})
        state = model.state_dict(keep_vars=True)
        wanted = {f"model/{k}" for k in state}
        stored = {k for k in list(index) + list(aliases) if k.startswith("model/")}
        if strict and wanted != stored:
            missing = sorted(k.removeprefix("model/") for k in wanted - stored)
            unexpected = sorted(k.removeprefix("model/") for k in stored - wanted)
            raise CheckpointError(
                f"Checkpoint {version} does not match the model: missing {missing[:10]}, unexpected {unexpected[:10]}. "
                "Load it into the model it was saved from, or pass strict=False."
            )
        # Everything the index can tell is checked before any tensor is written: a mismatch leaves
        # the model and the optimizer as they were.
        todo: list[tuple[str, torch.Tensor]] = []
        done: set[int] = set()
        for name, target in state.items():
            key = aliases.get(f"model/{name}", f"model/{name}")
            if key not in index or id(target) in done:
                continue
            if tuple(index[key]["shape"]) != tuple(target.shape):
                raise CheckpointError(
                    f"{name!r} has shape {tuple(index[key]['shape'])} in the checkpoint but {tuple(target.shape)} in "
                    "the model. Nothing was loaded."
                )
            todo.append((key, target))
            done.add(id(target))
        if not todo:
            raise CheckpointError(
                f"Checkpoint {version} holds none of the model's {len(state)} tensors (strict=False loads the ones "
                "whose names match, and no name matches). Nothing was loaded."
            )
        plan = _optimizer_plan(optimizer, model, meta, index) if optimizer is not None else None
        for key, target in todo:
            _set(target, _place(target, _assemble(reader, key, index[key])))
        if plan is not None:
            _load_optimizer(optimizer, plan, index, reader)
        return dict(meta.get("extra", {}))


@dataclass(frozen=True)
class _OptimizerPlan:
    """What `load_sharded` puts into an optimizer, worked out (and checked) before loading."""

    groups: list[dict[str, Any]]  # param_groups for ``optimizer.load_state_dict``
    position: dict[str, int]  # parameter name -> its index in this optimizer
    params: dict[str, torch.Tensor]  # the model's parameters by name
    tensors: list[tuple[str, str, str]]  # (index key, parameter name, state field)
    scalars: dict[str, dict[str, Any]]  # parameter name -> its non-tensor state


def _optimizer_plan(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, meta: dict, index: dict
) -> _OptimizerPlan:
    """How the checkpoint's optimizer state goes into ``optimizer``, checked against the
    checkpoint before anything is loaded. State follows parameter names: each of the
    optimizer's groups takes the saved group with the same parameters (in any order), so a
    reordered optimizer, or reordered groups, still gets each parameter's own state.

    Raises:
        CheckpointError: no optimizer state saved, or groups / parameters that do not match.
    """
    optim_json = meta.get("optimizer") or {}
    if not optim_json:
        raise CheckpointError(
            "The checkpoint has no optimizer state; save it with save_sharded(path, model, optimizer), or load "
            "without the optimizer."
        )
    names = {id(p): n for n, p in model.named_parameters()}
    current: list[list[str]] = []
    for j, group in enumerate(optimizer.param_groups):
        foreign = [tuple(p.shape) for p in group["params"] if id(p) not in names]
        if foreign:
            raise CheckpointError(
                f"The optimizer's group {j} holds parameters of shapes {foreign[:3]} that the model does not; build "
                "the optimizer from this model's parameters (after wrapping it with FSDP)."
            )
        current.append([names[id(p)] for p in group["params"]])
    position = {n: i for i, n in enumerate(n for group in current for n in group)}
    saved_groups = optim_json["param_groups"]
    if len(saved_groups) != len(current):
        raise CheckpointError(
            f"The checkpoint's optimizer has {len(saved_groups)} parameter groups, this one {len(current)}; build "
            "it with the same groups as the one that was saved."
        )
    by_members = {frozenset(g["params"]): g for g in saved_groups}
    groups = []
    for j, members in enumerate(current):
        saved = by_members.get(frozenset(members))
        if saved is None:
            sizes = [len(g["params"]) for g in saved_groups]
            raise CheckpointError(
                f"The optimizer's group {j} ({len(members)} parameters, {members[:3]}...) matches no parameter group "
                f"of the checkpoint's optimizer (groups of {sizes} parameters); build the optimizer with the same "
                "groups as the one that was saved."
            )
        # JSON has no tuples: hyperparameters such as AdamW's betas come back as they went in.
        group = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k != "params"}
        group["params"] = [position[n] for n in members]  # this optimizer's order: torch maps by position
        groups.append(group)
    params = dict(model.named_parameters())
    tensors = []
    for key, entry in index.items():
        if not key.startswith("optim/"):
            continue
        pname, field = key.removeprefix("optim/").rsplit("/", 1)
        tensors.append((key, pname, field))
        if pname not in params:
            raise CheckpointError(f"Optimizer state {field!r} for {pname!r}, which the model does not have.")
        if pname not in position:
            raise CheckpointError(
                f"Optimizer state {field!r} for {pname!r}, a parameter this optimizer does not hold; build the "
                "optimizer over the same parameters as the one that was saved."
            )
        if tuple(entry["shape"]) not in ((), tuple(params[pname].shape)):
            raise CheckpointError(
                f"Optimizer state {field!r} of {pname!r} has shape {tuple(entry['shape'])} in the checkpoint; the "
                f"parameter has shape {tuple(params[pname].shape)}."
            )
    scalars = optim_json.get("scalars", {})
    for pname in scalars:
        if pname not in position:
            raise CheckpointError(f"Optimizer state for {pname!r}, which this optimizer does not hold.")
    return _OptimizerPlan(groups, position, params, tensors, scalars)


def _load_optimizer(optimizer: torch.optim.Optimizer, plan: _OptimizerPlan, index: dict, reader: _Reader) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, pname, field in plan.tensors:
        value = _assemble(reader, key, index[key])
        param = plan.params[pname]
        if tuple(value.shape) == tuple(param.shape) and value.dim() > 0:
            value = _place(param, value)  # in the parameter's dtype and layout
        state.setdefault(plan.position[pname], {})[field] = value
    for pname, scalars in plan.scalars.items():
        state.setdefault(plan.position[pname], {}).update(scalars)
    optimizer.load_state_dict({"state": state, "param_groups": plan.groups})


def consolidate(path: str | os.PathLike[str], *, optimizer: bool = False) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of the checkpoint at ``path``, on the host.

    With ``optimizer=True`` the optimizer tensors are included as ``optim/<param>/<field>``.
    Tied weights appear under each of their names, as in ``model.state_dict()``.
    """
    with _locked(Path(path), shared=True):
        version = checkpoint_version(path)
        meta = _read_index(version)
        reader = _Reader(version)
        out: dict[str, torch.Tensor] = {}
        for key, entry in meta["tensors"].items():
            if key.startswith("model/"):
                out[key.removeprefix("model/")] = _assemble(reader, key, entry)
            elif optimizer:
                out[key] = _assemble(reader, key, entry)
        for alias, target in meta.get("aliases", {}).items():
            if alias.startswith("model/") and target.removeprefix("model/") in out:
                out[alias.removeprefix("model/")] = out[target.removeprefix("model/")]
        return out
