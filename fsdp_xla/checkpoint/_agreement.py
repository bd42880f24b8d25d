"""The fingerprints the ranks of a DTensor save or load agree on before any of them writes or
loads (`spmd._backend.agreement`): a rank one step behind, with another path, model or
optimizer would otherwise write blocks that rank 0's index does not describe, or load another
version than the others."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from spmd.backend import agree, backend_for, spec_text

__all__ = ["agree_on_load", "agree_on_save"]

SAME_SAVE = (
    "Call save_sharded on every rank at the same step, with the same path, model, optimizer, extra and keep "
    "(extra is what rank 0 writes for all: a per-rank value, such as an RNG state, goes in gathered, one per rank). "
    "Nothing was written."
)
SAME_LOAD = (
    "Every rank loads the same checkpoint version into the same model: give every rank the same path, on storage "
    "all ranks see alike, and do not save into it while the ranks load. Nothing was loaded."
)


def _tensors_text(tensors: dict[str, torch.Tensor]) -> str:
    """Each tensor's name, global shape, dtype and layout (a DTensor's placements)."""
    parts = []
    for name, t in tensors.items():
        placements = getattr(t, "placements", None)
        layout = "" if placements is None else " " + spec_text(tuple(placements))
        parts.append(f"{name} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}{layout}")
    return ", ".join(parts)


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):  # keys json cannot sort: refused by check_extra once the ranks agree
        return repr(value)


def agree_on_save(root: Path, tensors: dict, aliases: dict, optim_json: dict, extra: object, keep: object) -> None:
    """Every rank saves the same thing (one small collective).

    Raises:
        RankDisagreementError: on every rank, naming what differs.
    """
    fields = {
        "path": str(root),
        "extra": _json_text(extra),
        "keep": repr(keep),
        "tensors": _tensors_text(tensors),
        "aliases": _json_text(aliases),
        "optimizer": _json_text(optim_json),
    }
    agree(backend_for(None), "save_sharded", fields, SAME_SAVE)


def agree_on_load(root: Path, version: Path, strict: bool, model: torch.nn.Module, optimizer: object) -> None:
    """Every rank loads one version into one model (one small collective).

    Raises:
        RankDisagreementError: on every rank, naming what differs.
    """
    fields = {
        "path": str(root),
        "version": version.name,
        "strict": repr(strict),
        "model": _tensors_text(model.state_dict(keep_vars=True)),
        "optimizer": type(optimizer).__name__,
    }
    agree(backend_for(None), "load_sharded", fields, SAME_LOAD)
