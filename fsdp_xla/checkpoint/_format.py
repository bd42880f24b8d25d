"""What a sharded checkpoint may contain: the names the writer uses and a check of the index.

A checkpoint may come from someone else or from damaged storage, so nothing read from it names
a path: ``LATEST`` must hold a version name the writer makes (``v-<UTC time>-<8 hex>``) and
every block's file a device file name (``device-00003.safetensors``), both plain names inside
the checkpoint. `check_index` checks every entry of ``index.json`` before any tensor is read:
dtypes from an allow-list, non-negative shapes, blocks inside their tensor that tile it exactly
(no overlap, nothing missing). Pure Python; a failure is a `CheckpointError` naming the file and
the entry.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from pathlib import Path

import numpy as np
import torch

from fsdp_xla.errors import CheckpointError
from mesh._checks import is_int

__all__ = [
    "FORMAT",
    "DTYPES",
    "DTYPE_NAMES",
    "version_name",
    "device_file_name",
    "check_version_name",
    "check_index",
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


def check_index(meta: object, where: Path) -> None:
    """Check a parsed ``index.json`` (``where``: its path, for messages) before reading tensors.

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
    for key, entry in tensors.items():
        if not (key.startswith("model/") or (key.startswith("optim/") and key.count("/") >= 2)):
            raise _fail(str(where), str(key), "is neither model/<name> nor optim/<parameter>/<field>")
        _check_entry(str(key), entry, where)
    if isinstance(meta.get("optimizer", {}), dict):
        _check_optimizer(meta.get("optimizer", {}), where)
    aliases = meta.get("aliases", {})
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
    for section in ("optimizer", "extra"):
        if not isinstance(meta.get(section, {}), dict):
            raise CheckpointError(f"{where}: {section!r} must be an object; the checkpoint is damaged.")


def _check_optimizer(optim: object, where: Path) -> None:
    if not isinstance(optim, dict) or not optim:
        return  # no optimizer state saved; 'optimizer' must be an object (checked by the caller)
    groups, scalars = optim.get("param_groups"), optim.get("scalars", {})
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and all(isinstance(p, str) for p in g["params"])
        for g in groups
    ):
        raise CheckpointError(f"{where}: optimizer 'param_groups' must be a list of groups with parameter names.")
    if not isinstance(scalars, dict) or not all(isinstance(v, dict) for v in scalars.values()):
        raise CheckpointError(f"{where}: optimizer 'scalars' must map parameter names to objects.")


def _check_entry(key: str, entry: object, where: Path) -> None:
    w = str(where)
    if not isinstance(entry, dict):
        raise _fail(w, key, "is not an object")
    shape, dtype, blocks = entry.get("shape"), entry.get("dtype"), entry.get("blocks")
    if not isinstance(shape, list) or not all(is_int(n) and n >= 0 for n in shape) or len(shape) > 64:
        raise _fail(w, key, f"has shape {str(shape)[:100]}, not a list of at most 64 integers >= 0")
    if dtype not in DTYPE_NAMES:
        raise _fail(w, key, f"has dtype {str(dtype)[:50]!r}; allowed: {sorted(DTYPE_NAMES)}")
    if not isinstance(blocks, list) or not blocks:
        raise _fail(w, key, "has no list of blocks")
    boxes = []
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
    if math.prod(shape) > 0:
        _check_tiling(key, shape, boxes, w)


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
