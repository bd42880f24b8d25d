"""Loading: `load_sharded` into a model (and optimizer) laid out any way, and `consolidate` to
one host state dict.

A refused load changes nothing. Everything the index can tell (names, shapes, the optimizer's
groups) is checked first; then every block the load needs is read and verified (its shape
against the index's bounds, its stored dtype against the index's, its CRC-32) before any
parameter or optimizer state is written; only then are the tensors assembled, laid out as the
model's are now, and set.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch

from fsdp_xla.checkpoint._agreement import agree_on_load
from fsdp_xla.checkpoint._arguments import check_arguments, check_path
from fsdp_xla.checkpoint._dtensor import agree, distributed, is_dtensor, place_dtensor
from fsdp_xla.checkpoint._files import LATEST, Reader, checkpoint_version, locked, read_index
from fsdp_xla.checkpoint._format import Block, CheckpointIndex, TensorEntry, checksum
from fsdp_xla.checkpoint._lineage import remember_lineage
from fsdp_xla.checkpoint._optimizer import load_optimizer, optimizer_plan
from fsdp_xla.errors import CheckpointError, CheckpointTypeError
from mesh.checks import require_bool
from spmd.backend import torch_xla_backend
from spmd.sharding import HloSharding

__all__ = ["consolidate", "load_sharded"]


def _checked_block(reader: Reader, name: str, entry: TensorEntry, block: Block) -> torch.Tensor:
    """One block of tensor ``name`` as stored, refused unless it is what the index says."""
    data = reader.block(block.file, name)
    where = f"{name!r}: the block in {reader.version / block.file}"
    if tuple(data.shape) != block.shape:
        raise CheckpointError(
            f"{where} has shape {tuple(data.shape)}, the index says {block.shape}: the checkpoint is damaged or was "
            "edited. Restore it from a copy, or load an older version."
        )
    if data.dtype != entry.torch_dtype:
        raise CheckpointError(
            f"{where} is stored as {str(data.dtype).removeprefix('torch.')} where the index says {entry.dtype}: "
            "refused, not cast. The checkpoint is damaged or was edited."
        )
    if block.crc32 is not None and checksum(data) != block.crc32:  # checkpoints before checksums have none
        raise CheckpointError(
            f"{where} does not have the checksum the index recorded when it was saved: the file's data is damaged. "
            "Restore the checkpoint from a copy, or load an older version."
        )
    return data


def _verify(reader: Reader, name: str, entry: TensorEntry) -> None:
    """Read and check every block of ``name``, keeping none (bounded memory)."""
    for block in entry.blocks:
        _checked_block(reader, name, entry, block)


def _assemble(reader: Reader, name: str, entry: TensorEntry) -> torch.Tensor:
    """Tensor ``name`` whole, on the host, from its checked blocks."""
    full = torch.empty(entry.shape, dtype=entry.torch_dtype)
    covered = 0
    for block in entry.blocks:
        data = _checked_block(reader, name, entry, block)
        full[block.region] = data
        covered += data.numel()
    if covered != full.numel():
        raise CheckpointError(
            f"{name!r}: the blocks cover {covered} of {full.numel()} elements of {entry.shape}: the checkpoint is "
            "damaged or was edited. Restore it from a copy, or load an older version."
        )
    return full


def _place(target: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` (of ``target``'s shape: callers check it from the index first) laid out as ``target``."""
    value = value.to(target.dtype)
    if is_dtensor(target):
        return place_dtensor(target, value)
    if torch_xla_backend.is_xla_tensor(target):
        sharding = torch_xla_backend.sharding_of(target) or HloSharding.replicated()
        return torch_xla_backend.to_device_sharded(value, sharding)
    return value.to(target.device)


def _set(target: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        if is_dtensor(target):  # FSDP2 keeps its parameters' storage: copy into the local block
            target.to_local().copy_(value.to_local())
        else:
            target.data = value


def _model_targets(
    model: torch.nn.Module, saved: CheckpointIndex, version: Path, strict: bool
) -> list[tuple[str, torch.Tensor]]:
    """(index key, model tensor) of every tensor to load, checked by name and shape."""
    index, aliases = saved.tensors, saved.aliases
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
    todo: list[tuple[str, torch.Tensor]] = []
    done: set[int] = set()
    for name, target in state.items():
        key = aliases.get(f"model/{name}", f"model/{name}")
        if key not in index or id(target) in done:
            continue
        _check_like_target(name, index[key], target)
        todo.append((key, target))
        done.add(id(target))
    if not todo:
        raise CheckpointError(
            f"Checkpoint {version} holds none of the model's {len(state)} tensors (strict=False loads the ones whose "
            "names match, and no name matches). Nothing was loaded."
        )
    return todo


def _check_like_target(name: str, entry: TensorEntry, target: torch.Tensor) -> None:
    """Refuse a stored tensor of another shape than the model's, or of a dtype the model's cannot
    hold exactly: a widening cast (bf16 into an fp32 model) loads, a narrowing one (an fp32
    checkpoint into a bf16 model) or another kind (floats into ints) would lose what the user did
    not ask to lose."""
    if entry.shape != tuple(target.shape):
        raise CheckpointError(
            f"{name!r} has shape {entry.shape} in the checkpoint but {tuple(target.shape)} in the "
            "model. Load it into the model it was saved from. Nothing was loaded."
        )
    mine = str(target.dtype).removeprefix("torch.")
    if entry.dtype != mine and not _widens(entry.dtype, target.dtype):
        raise CheckpointError(
            f"{name!r} is {entry.dtype} in the checkpoint but {mine} in the model, which cannot hold it exactly. "
            f"Convert the model to the checkpoint's dtype before loading (model.to(torch.{entry.dtype})), then "
            f"after it if you want {mine}. Nothing was loaded."
        )


def _widens(saved: str, target: torch.dtype) -> bool:
    """The model's floating dtype holds every value of the saved one (bf16 or fp16 into fp32)."""
    source = getattr(torch, saved, None)
    return (
        isinstance(source, torch.dtype)
        and source.is_floating_point
        and target.is_floating_point
        and torch.promote_types(source, target) == target
        and torch.finfo(target).bits > torch.finfo(source).bits
    )


def load_sharded(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    strict: bool = True,
) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``model`` (and ``optimizer``), in place, laid out as
    the model's tensors are now (any mesh, any device count). A refused load changes nothing;
    on the DTensor backend the ranks agree first, so one rank's refusal is every rank's.

    Returns:
        The ``extra`` values saved with it.

    Raises:
        CheckpointError: missing or damaged checkpoint (a block whose checksum, dtype or shape is
            not the index's included), a missing or unexpected key (when ``strict``), or a
            shape that does not match; the message names the key.
    """
    root = check_arguments("load_sharded", path, model, optimizer)
    require_bool(strict, "load_sharded: strict", CheckpointTypeError)
    ranks = distributed(model.state_dict(keep_vars=True))
    with contextlib.ExitStack() as stack:
        try:
            if not (root / LATEST).exists() and not (root / LATEST).is_symlink():
                checkpoint_version(root)  # raises, naming the path; no lock file is left in a non-checkpoint
            stack.enter_context(locked(root, shared=True))  # no save removes this version meanwhile
            prepared = _prepare(root, model, optimizer, strict)
            refusal = None
        except Exception as e:  # re-raised as it is, after the ranks have agreed (none waits for another)
            refusal = e
        if ranks:
            _agree_on_refusal(refusal)
        if refusal is not None:
            raise refusal
        saved, reader, todo, plan = prepared
        if ranks:  # one version into one model on every rank, or none loads
            agree_on_load(root, reader.version, strict, model, optimizer)
        index = saved.tensors
        if plan is not None:  # first: torch's own checks of the state run before the model changes
            load_optimizer(optimizer, plan, lambda key: _assemble(reader, key, index[key]), _place)
        for key, target in todo:
            _set(target, _place(target, _assemble(reader, key, index[key])))
            _set_extra_state(model, key.removeprefix("model/"), target)
        remember_lineage(root, saved.lineage)  # this process's saves here continue it
        return dict(saved.extra)


def _set_extra_state(model: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """A module's tensor ``get_extra_state()`` goes back through its ``set_extra_state`` (the
    tensor ``state_dict`` showed may be a fresh one, which setting would not reach)."""
    owner, _, leaf = name.rpartition(".")
    if leaf == "_extra_state":  # torch's name for it: no parameter or buffer may take it
        model.get_submodule(owner).set_extra_state(value)


def _prepare(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, strict: bool) -> tuple:
    """(index, reader, model targets, optimizer plan): everything checked, every block the load
    needs read and verified, nothing written."""
    version = checkpoint_version(root)
    saved = read_index(version)
    reader = Reader(version)
    index = saved.tensors
    todo = _model_targets(model, saved, version, strict)
    plan = optimizer_plan(optimizer, model, saved) if optimizer is not None else None
    keys = [key for key, _ in todo] + ([key for key, _, _ in plan.tensors] if plan is not None else [])
    for key in keys:
        _verify(reader, key, index[key])
    return saved, reader, todo, plan


def _agree_on_refusal(refusal: Exception | None) -> None:
    """Every rank's verdict (a collective): if any rank refused, every rank refuses, naming it."""
    verdicts = agree(str(refusal) if refusal is not None else "")
    if refusal is None:
        first = next(((r, v) for r, v in enumerate(verdicts) if v), None)
        if first is not None:
            raise CheckpointError(
                f"Rank {first[0]} refused the load ({first[1][:500]}); so every rank refuses and nothing was loaded on "
                "any. Every rank must read the same, undamaged checkpoint."
            )


def consolidate(path: str | os.PathLike[str], *, optimizer: bool = False) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of the checkpoint at ``path``, on the host.

    With ``optimizer=True`` the optimizer tensors are included as ``optim/<param>/<field>``.
    Tied weights appear under each of their names, as in ``model.state_dict()``. Every block is
    verified (shape, dtype, checksum) before any tensor is assembled.
    """
    root = check_path("consolidate", path)
    require_bool(optimizer, "consolidate: optimizer", CheckpointTypeError)
    if not (root / LATEST).exists() and not (root / LATEST).is_symlink():
        checkpoint_version(root)  # raises, naming the path; no lock file is left in a non-checkpoint
    with locked(root, shared=True):
        version = checkpoint_version(root)
        saved = read_index(version)
        reader = Reader(version)
        keys = [k for k in saved.tensors if k.startswith("model/") or optimizer]
        for key in keys:  # a block unlike its index entry is refused before its tensor is allocated
            _verify(reader, key, saved.tensors[key])
        out: dict[str, torch.Tensor] = {}
        for key in keys:
            out[key.removeprefix("model/")] = _assemble(reader, key, saved.tensors[key])
        for alias, target in saved.aliases.items():
            if alias.startswith("model/") and target.removeprefix("model/") in out:
                out[alias.removeprefix("model/")] = out[target.removeprefix("model/")]
        return out
