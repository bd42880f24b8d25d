"""What a sharded checkpoint may contain: the names the writer uses and a check of the index.

A checkpoint may come from someone else or from damaged storage, so nothing read from it names
a path: ``LATEST`` must hold a version name the writer makes (``v-<UTC time>-<8 hex>``) and
every block's file a device file name (``device-00003.safetensors``), both plain names inside
the checkpoint. `parse_index` checks every entry of ``index.json`` before any tensor is read
(dtypes from an allow-list, non-negative shapes, blocks inside their tensor that tile it
exactly: no overlap, nothing missing) and returns it as a frozen `CheckpointIndex`, so the code
after the parse reads typed fields, never the JSON's dicts. Pure Python; a failure is a
`CheckpointError` naming the file and the entry.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from fsdp_xla.errors import CheckpointError
from mesh.checks import is_int

__all__ = [
    "FORMAT",
    "DTYPES",
    "DTYPE_NAMES",
    "version_name",
    "device_file_name",
    "check_version_name",
    "Block",
    "CheckpointIndex",
    "SavedOptimizer",
    "TensorEntry",
    "parse_index",
    "is_version_name",
    "checksum",
]

FORMAT = "fsdp_xla.sharded/1"
# Every dtype safetensors stores (its own names differ; these are torch's).
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "float32", "float16", "bfloat16", "float64", "complex64",
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
        "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool",
    )
}  # fmt: skip
DTYPE_NAMES = frozenset(DTYPES)
_VERSION = re.compile(r"v-\d{8}T\d{6}-[0-9a-f]{8}")
_DEVICE_FILE = re.compile(r"device-\d{5}\.safetensors")
# A GSPMD layout is a grid of blocks; an index whose cut points make far more grid cells than
# blocks is not one, and checking it cell by cell could take unbounded time and memory.
_MAX_CELLS_PER_BLOCK = 64


@dataclass(frozen=True)
class Block:
    """One stored block of a tensor: its device file, its ``[start, stop)`` per dim, its CRC-32
    (``None`` in checkpoints written before checksums)."""

    file: str
    index: tuple[tuple[int, int], ...]
    crc32: int | None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.index)

    @property
    def region(self) -> tuple[slice, ...]:
        """Where the block goes in the whole tensor."""
        return tuple(slice(start, stop) for start, stop in self.index)


@dataclass(frozen=True)
class TensorEntry:
    """A tensor of the checkpoint: shape, dtype name (one of `DTYPE_NAMES`) and blocks."""

    shape: tuple[int, ...]
    dtype: str
    blocks: tuple[Block, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class SavedOptimizer:
    """The optimizer's non-tensor state as saved: its parameter groups (each with ``params``, a
    list of parameter names, and the group's hyperparameters) and each parameter's scalars."""

    param_groups: tuple[dict[str, Any], ...]
    scalars: MappingProxyType[str, dict[str, Any]]
    optimizer_class: str | None = None  # "module.Class"; None in checkpoints from before it was recorded


@dataclass(frozen=True)
class CheckpointIndex:
    """A version's ``index.json``, checked (`parse_index`): tensors by key (``model/<name>``,
    ``optim/<parameter>/<field>``), aliases (a tied weight's other names), the optimizer's state
    (``None`` when none was saved), the caller's ``extra`` and the lineage of the save."""

    tensors: MappingProxyType[str, TensorEntry]
    aliases: MappingProxyType[str, str]
    optimizer: SavedOptimizer | None
    extra: MappingProxyType[str, Any]
    lineage: object

    def files(self) -> list[str]:
        """Every device file the index names, sorted."""
        return sorted({b.file for entry in self.tensors.values() for b in entry.blocks})


def version_name(stamp: str, token: str) -> str:
    """The writer's name for a version directory (``stamp``: ``%Y%m%dT%H%M%S``; 8 hex digits)."""
    name = f"v-{stamp}-{token}"
    if not _VERSION.fullmatch(name):
        raise ValueError(f"not a version name: {name!r}")
    return name


def checksum(data: torch.Tensor) -> int:
    """CRC-32 of a block's bytes as stored (recorded in the index at save, checked at load)."""
    raw = data.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return zlib.crc32(raw)


def is_version_name(name: str) -> bool:
    """Whether ``name`` is a version directory name the writer makes."""
    return _VERSION.fullmatch(name) is not None


def device_file_name(device: int) -> str:
    """The writer's name for device ``device``'s shard file."""
    return f"device-{device:05d}.safetensors"


def check_version_name(text: str, latest: Path) -> str:
    """``text`` (read from ``latest``) if it is a version name the writer makes.

    Raises:
        CheckpointError: anything else (a path, ``..``, an absolute name, junk).
    """
    name = text.strip()
    if not _VERSION.fullmatch(name):
        # Its bytes are not shown: they are not a version name, so nothing vouches for them.
        raise CheckpointError(
            f"{latest} does not hold a checkpoint version name ({len(text)} characters; a version is "
            "v-YYYYMMDDTHHMMSS-xxxxxxxx inside the checkpoint directory). The file is damaged or was edited; restore "
            "it or write a version's name into it."
        )
    return name


def _fail(where: str, key: str, what: str) -> CheckpointError:
    return CheckpointError(
        f"{where}: entry {key[:200]!r} {what}. The checkpoint is damaged or was not written by fsdp_xla."
    )


def parse_index(meta: object, where: Path) -> CheckpointIndex:
    """A parsed ``index.json`` (``where``: its path, for messages), checked before any tensor
    is read, as a `CheckpointIndex`.

    Raises:
        CheckpointError: the first entry that is malformed, names a file other than a device
            file of this checkpoint, or whose blocks leave the tensor, overlap, or miss part of it.
    """
    if not isinstance(meta, dict):
        raise CheckpointError(f"{where} holds a {type(meta).__name__}, not an object: the checkpoint is damaged.")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{where} has format {meta.get('format')!r}; this reader knows {FORMAT!r}.")
    tensors = meta.get("tensors")
    if not isinstance(tensors, dict) or not all(isinstance(k, str) for k in tensors):
        raise CheckpointError(f"{where}: 'tensors' must be an object; the checkpoint is damaged.")
    entries = {}
    for key, entry in tensors.items():
        if not (key.startswith("model/") or (key.startswith("optim/") and key.count("/") >= 2)):
            raise _fail(str(where), str(key), "is neither model/<name> nor optim/<parameter>/<field>")
        entries[key] = _parse_entry(str(key), entry, where)
    for section in ("optimizer", "extra"):
        if not isinstance(meta.get(section, {}), dict):
            raise CheckpointError(f"{where}: {section!r} must be an object; the checkpoint is damaged.")
    return CheckpointIndex(
        tensors=MappingProxyType(entries),
        aliases=MappingProxyType(_parse_aliases(meta.get("aliases", {}), tensors, where)),
        optimizer=_parse_optimizer(meta.get("optimizer", {}), where),
        extra=MappingProxyType(meta.get("extra", {})),
        lineage=meta.get("lineage"),
    )


def _parse_aliases(aliases: object, tensors: dict, where: Path) -> dict[str, str]:
    if not isinstance(aliases, dict):
        raise CheckpointError(f"{where}: 'aliases' must be an object; the checkpoint is damaged.")
    for alias, target in aliases.items():
        if not isinstance(target, str) or target not in tensors:
            raise _fail(str(where), str(alias), f"is an alias of {str(target)[:200]!r}, which the index does not hold")
        if not (alias.startswith("model/") and target.startswith("model/")):
            # A model tensor shares storage only with another model tensor (tied weights).
            raise _fail(
                str(where), alias, f"is an alias of {target[:200]!r}; an alias names a model/ tensor of the model"
            )
    return dict(aliases)


def _parse_optimizer(optim: dict, where: Path) -> SavedOptimizer | None:
    if not optim:
        return None  # no optimizer state saved
    groups, scalars = optim.get("param_groups"), optim.get("scalars", {})
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and all(isinstance(p, str) for p in g["params"])
        for g in groups
    ):
        raise CheckpointError(f"{where}: optimizer 'param_groups' must be a list of groups with parameter names.")
    if not isinstance(scalars, dict) or not all(isinstance(v, dict) for v in scalars.values()):
        raise CheckpointError(f"{where}: optimizer 'scalars' must map parameter names to objects.")
    cls = optim.get("class")
    if cls is not None and not (isinstance(cls, str) and len(cls) <= 300):
        raise CheckpointError(f"{where}: optimizer 'class' must be a class name (a short string).")
    return SavedOptimizer(param_groups=tuple(groups), scalars=MappingProxyType(scalars), optimizer_class=cls)


def _parse_entry(key: str, entry: object, where: Path) -> TensorEntry:
    w = str(where)
    if not isinstance(entry, dict):
        raise _fail(w, key, "is not an object")
    shape, dtype, blocks = entry.get("shape"), entry.get("dtype"), entry.get("blocks")
    if not isinstance(shape, list) or not all(is_int(n) and n >= 0 for n in shape) or len(shape) > 64:
        raise _fail(w, key, f"has shape {str(shape)[:100]}, not a list of at most 64 integers >= 0")
    if not isinstance(dtype, str) or dtype not in DTYPE_NAMES:  # a list or dict is not even hashable
        raise _fail(w, key, f"has dtype {str(dtype)[:50]!r}; allowed: {sorted(DTYPE_NAMES)}")
    if not isinstance(blocks, list) or not blocks:
        raise _fail(w, key, "has no list of blocks")
    boxes, parsed = [], []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise _fail(w, key, f"block {i} is not an object")
        file = block.get("file")
        if not isinstance(file, str) or not _DEVICE_FILE.fullmatch(file):
            raise _fail(
                w,
                key,
                f"block {i} names file {str(file)[:200]!r}; only device-NNNNN.safetensors inside the version "
                "directory may be read",
            )
        index = block.get("index")
        if (
            not isinstance(index, list)
            or len(index) != len(shape)
            or not all(isinstance(b, list) and len(b) == 2 and is_int(b[0]) and is_int(b[1]) for b in index)
        ):
            raise _fail(w, key, f"block {i} has index {str(index)[:100]}, not one [start, stop] per dim of {shape}")
        crc = block.get("crc32", 0)
        if not is_int(crc) or not 0 <= crc < 2**32:
            raise _fail(w, key, f"block {i} has checksum {str(crc)[:50]}, not a CRC-32")
        for d, ((lo, hi), n) in enumerate(zip(index, shape)):
            if not 0 <= lo <= hi <= n:
                raise _fail(w, key, f"block {i} spans [{lo}, {hi}) on dim {d}, outside 0..{n}")
        boxes.append([(int(lo), int(hi)) for lo, hi in index])
        parsed.append(Block(file, tuple(boxes[-1]), None if "crc32" not in block else int(crc)))
    if math.prod(shape) > 0:
        _check_tiling(key, shape, boxes, w)
    return TensorEntry(tuple(int(n) for n in shape), dtype, tuple(parsed))


def _check_tiling(key: str, shape: list[int], boxes: list[list[tuple[int, int]]], where: str) -> None:
    cuts = [sorted({0, n} | {b[d][0] for b in boxes} | {b[d][1] for b in boxes}) for d, n in enumerate(shape)]
    cells = math.prod(len(c) - 1 for c in cuts)
    if cells > _MAX_CELLS_PER_BLOCK * len(boxes) + 1024:
        raise _fail(where, key, f"has {len(boxes)} blocks that do not form a grid over shape {shape}")
    covered = np.zeros([len(c) - 1 for c in cuts], dtype=bool)
    for i, box in enumerate(boxes):
        region = tuple(slice(cuts[d].index(lo), cuts[d].index(hi)) for d, (lo, hi) in enumerate(box))
        if covered[region].any():
            raise _fail(where, key, f"block {i} overlaps another block")
        covered[region] = True
    if not covered.all():
        lows = [c[:-1] for c in cuts]
        first = next(idx for idx in itertools.product(*(range(len(lo)) for lo in lows)) if not covered[idx])
        at = [lows[d][first[d]] for d in range(len(shape))]
        raise _fail(where, key, f"has blocks that miss part of shape {shape} (from element {at})")
