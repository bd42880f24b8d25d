"""Saving: `save_sharded` writes each device's blocks (or, on DTensor, each rank's) into a new
version directory, then commits it with the ``LATEST`` rename (`fsdp_xla.checkpoint._files`)."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fsdp_xla.checkpoint._agreement import agree_on_save
from fsdp_xla.checkpoint._arguments import check_arguments, check_extra, check_keep
from fsdp_xla.checkpoint._dtensor import agree, broadcast, distributed, dtensor_index, first_holders, is_dtensor
from fsdp_xla.checkpoint._files import (
    LATEST,
    commit,
    is_disk_full,
    lineage_record,
    locked,
    new_version_name,
    prune,
    start_version,
    write_device_file,
    write_index,
)
from fsdp_xla.checkpoint._format import DTYPE_NAMES, FORMAT, checksum, device_file_name
from fsdp_xla.checkpoint._lineage import lineage_for_save, remember_lineage
from fsdp_xla.checkpoint._optimizer import optimizer_json
from fsdp_xla.errors import CheckpointError, CheckpointTypeError
from spmd.backend import torch_xla_backend
from spmd.sharding import HloSharding

__all__ = ["dtype_name", "save_sharded"]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class _Block:
    device: int
    index: tuple[tuple[int, int], ...]
    data: torch.Tensor


def _blocks(t: torch.Tensor) -> list[_Block]:
    """One host copy of each distinct block of ``t`` (replicas are written once); ``t`` must
    hold data already (`save_sharded` computes all pending tensors in one graph first)."""
    if not torch_xla_backend.is_xla_tensor(t):
        return [_Block(0, tuple((0, n) for n in t.shape), t.detach().cpu().contiguous())]
    sharding = torch_xla_backend.sharding_of(t) or HloSharding.replicated()
    shards = torch_xla_backend.local_shards(t)
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
    """(tensors by checkpoint name, aliases {name: name it shares storage with}, optimizer JSON),
    each checked to load back as it is, before anything is written."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[int, str] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        key = f"model/{name}"
        if not isinstance(t, torch.Tensor):  # a module's get_extra_state() that is not a tensor
            raise CheckpointTypeError(
                f"save_sharded: the model's state {name!r} is a {type(t).__name__}, not a tensor (a module's "
                "get_extra_state()); save_sharded saves tensors. Return a tensor from get_extra_state, or keep the "
                "value in extra={...}. Nothing was written."
            )
        if id(t) in seen:
            aliases[key] = seen[id(t)]
            continue
        seen[id(t)] = key
        tensors[key] = t
    optim_tensors, optim_json = optimizer_json(optimizer, model) if optimizer is not None else ({}, {})
    tensors.update(optim_tensors)
    for key, t in tensors.items():
        if dtype_name(t.dtype) not in DTYPE_NAMES:
            raise CheckpointTypeError(
                f"save_sharded: {key!r} (shape {tuple(t.shape)}) has dtype {dtype_name(t.dtype)}, which a checkpoint "
                f"cannot hold (safetensors stores {sorted(DTYPE_NAMES)}); convert it first. Nothing was written."
            )
    return tensors, aliases, optim_json


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
        extra: values to keep beside (step, epoch, ...): a dict of JSON values (string keys, no
            tuples or tensors), so that the load returns them as they were.
        keep: complete versions of this run's lineage to keep (the newest ``keep``; at least 1).
            A save removes only versions its own lineage wrote: this process's earlier saves
            into ``path`` and the version it loaded from there, and their predecessors
            (`fsdp_xla.checkpoint._lineage`). Versions another run or model wrote, and versions
            from before lineages were recorded, are never removed.

    Returns:
        The version directory written.
    """
    root = check_arguments("save_sharded", path, model, optimizer)
    tensors, aliases, optim_json = _named_tensors(model, optimizer)
    if distributed(tensors):  # first: then every rank refuses a bad keep or extra alike
        agree_on_save(root, tensors, aliases, optim_json, extra, keep)
    keep, extra = check_keep(keep), check_extra(extra)
    _make_root(root)
    if distributed(tensors):
        version, lineage = _save_distributed(root, tensors, aliases, optim_json, extra, keep, lineage_for_save(root))
        remember_lineage(root, lineage)  # rank 0's: every rank continues the lineage it wrote
        return version
    pending = [t for t in tensors.values() if torch_xla_backend.is_xla_tensor(t)]
    if pending:
        torch_xla_backend.sync_tensors(pending)
    with locked(root, shared=False):
        version, lineage = new_version_name(), lineage_for_save(root)
        work, lineage = start_version(root, version, lineage)  # refuses another run's LATEST first
        try:
            _write_version(work, tensors, aliases, optim_json, {**lineage_record(root, lineage), "extra": extra or {}})
            commit(root, work, version, lineage)
        except BaseException as e:
            shutil.rmtree(work, ignore_errors=True)
            if is_disk_full(e):
                raise CheckpointError(
                    f"Saving to {root} failed, the disk is full or a file size limit was hit ({e}). Nothing of "
                    f"this save remains; {root / LATEST} still names the previous checkpoint. Free space and "
                    "save again."
                ) from e
            raise
        prune(root, version, keep, lineage)
    return root / version


def _make_root(root: Path) -> None:
    """Create the checkpoint directory (and its parents), or say why it cannot be."""
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"save_sharded: {root} is a file; a checkpoint is a directory. Give another path.")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        blocker = next((p for p in root.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a directory" if blocker is not None else e.strerror
        raise CheckpointError(
            f"save_sharded: cannot create the checkpoint directory {root}: {why}. Give a path in a writable directory."
        ) from None


def _save_distributed(
    root: Path,
    tensors: dict[str, torch.Tensor],
    aliases: dict,
    optim_json: dict,
    extra: dict | None,
    keep: int,
    lineage: str,
) -> tuple[Path, str]:
    """`save_sharded` of a DTensor model: each rank writes its blocks, rank 0 commits; returns
    the version and rank 0's lineage (which every rank then continues)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    lock = locked(root, shared=False) if rank == 0 else contextlib.nullcontext()
    with lock:
        version, lineage, refusal = broadcast(_start_on_rank_0(root, lineage) if rank == 0 else None)
        if refusal:  # every rank raises rank 0's refusal: none waits for the others
            raise CheckpointError(refusal)
        work = root / f".{version}.partial"
        dist.barrier()
        indices, problem = _rank_indices(tensors, rank)
        written = first_holders(indices)  # every rank reaches the two collectives, or the others wait
        reports = agree((problem, {}) if problem else _write_rank_blocks(work, tensors, rank, indices, written))
        errors = [e for e, _ in reports if e]
        if errors:
            if rank == 0:
                shutil.rmtree(work, ignore_errors=True)
            full = any(is_disk_full(OSError(e)) for e in errors)
            kind = "the disk is full or a file size limit was hit" if full else "a rank failed to write"
            raise CheckpointError(
                f"Saving to {root} failed, {kind} ({errors[0]}); LATEST still names the previous checkpoint."
            )
        if rank == 0:
            index = {
                name: {
                    "shape": list(t.shape),
                    "dtype": dtype_name(t.dtype),
                    "blocks": [b for _, entries in reports for b in entries.get(name, [])],
                }
                for name, t in tensors.items()
            }
            meta = {"format": FORMAT, "tensors": index, "aliases": aliases, "optimizer": optim_json}
            write_index(work, {**meta, **lineage_record(root, lineage), "extra": extra or {}})
            commit(root, work, version, lineage)
            prune(root, version, keep, lineage)
        dist.barrier()
    return root / version, lineage


def _start_on_rank_0(root: Path, lineage: str) -> tuple[str, str, str]:
    """(version, lineage, refusal): rank 0's temp directory made, or why the save is refused."""
    version = new_version_name()
    try:
        _, lineage = start_version(root, version, lineage)
    except CheckpointError as e:
        return version, lineage, str(e)
    return version, lineage, ""


def _rank_indices(tensors: dict[str, torch.Tensor], rank: int) -> tuple[dict[str, tuple], str]:
    """The bounds of this rank's block of each DTensor, or ``{}`` and why they cannot be read (as
    `_write_rank_blocks` reports an error, for the ranks to agree on)."""
    try:
        return {name: dtensor_index(t) for name, t in tensors.items() if is_dtensor(t)}, ""
    except Exception as e:
        return {}, f"rank {rank}: {type(e).__name__}: {e}"


def _write_rank_blocks(
    work: Path, tensors: dict[str, torch.Tensor], rank: int, indices: dict[str, tuple], written: set[str]
) -> tuple[str, dict[str, list]]:
    """This rank's device file (the blocks of ``written``, those it is the first to hold, at
    ``indices``; rank 0 also the plain tensors every rank holds alike) and its index entries; or
    the error, as text, for the ranks to agree on."""
    mine: dict[str, torch.Tensor] = {}
    entries: dict[str, list] = {}
    try:
        for name, t in tensors.items():
            if is_dtensor(t):
                block = (rank, indices[name], t.to_local().detach().cpu().contiguous()) if name in written else None
            elif rank == 0:
                block = (0, tuple((0, n) for n in t.shape), t.detach().cpu().contiguous())
            else:
                continue
            if block is None:  # a copy another rank writes
                continue
            mine[name] = block[2]
            entries[name] = [
                {"file": device_file_name(block[0]), "index": [list(b) for b in block[1]], "crc32": checksum(block[2])}
            ]
        if mine:
            write_device_file(work / device_file_name(rank), mine)
    except Exception as e:
        return f"rank {rank}: {type(e).__name__}: {e}", {}
    return "", entries


def _write_version(work: Path, tensors: dict[str, torch.Tensor], aliases: dict, optim_json: dict, tail: dict) -> None:
    """The device files, then the index (``tail``: its ``lineage`` and ``extra``)."""
    per_device: dict[int, dict[str, torch.Tensor]] = {}
    index: dict[str, Any] = {}
    for name, t in tensors.items():
        entry = {"shape": list(t.shape), "dtype": dtype_name(t.dtype), "blocks": []}
        for block in _blocks(t):
            per_device.setdefault(block.device, {})[name] = block.data
            entry["blocks"].append(
                {"file": device_file_name(block.device), "index": block.index, "crc32": checksum(block.data)}
            )
        index[name] = entry
    for device, content in sorted(per_device.items()):
        write_device_file(work / device_file_name(device), content)
    write_index(work, {"format": FORMAT, "tensors": index, "aliases": aliases, "optimizer": optim_json, **tail})
