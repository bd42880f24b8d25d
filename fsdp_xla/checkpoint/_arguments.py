"""The checkpoint functions' arguments, checked before anything is read or written: the path
(and a path and model given the other way round), the model and optimizer, bool flags, ``keep``
and ``extra`` (values that come back from JSON as they went in)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from fsdp_xla.errors import CheckpointError, CheckpointTypeError
from mesh.checks import require_int

__all__ = ["check_arguments", "check_extra", "check_keep", "check_path", "json_problem"]


def check_path(what: str, path: object, second: object = None) -> Path:
    """``path`` as a Path: a str or os.PathLike naming a directory (``second``: the argument
    after it, to recognise the two given the other way round)."""
    if not isinstance(path, (str, os.PathLike)):
        if isinstance(path, torch.nn.Module) and isinstance(second, (str, os.PathLike)):
            raise CheckpointTypeError(
                f"{what}(path, model, ...): path and model are swapped: got the model ({type(path).__name__}) first "
                f"and the path {os.fspath(second)!r:.100} second. Call {what}(path, model, ...)."
            )
        raise CheckpointTypeError(
            f"{what}: path must be a str or os.PathLike (the checkpoint directory), got {type(path).__name__} "
            f"{path!r:.100}."
        )
    text = os.fspath(path)
    if not text or "\x00" in str(text):  # "" would be the current directory, silently
        raise CheckpointError(f"{what}: path {text!r:.100} is not a directory path; give the checkpoint directory.")
    return Path(text)


def check_arguments(what: str, path: object, model: object, optimizer: object) -> Path:
    """TypeErrors naming the argument, before anything is read or written; returns the path."""
    root = check_path(what, path, model)
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
    return root


def check_keep(keep: object) -> int:
    """``keep`` (versions to keep) as an int >= 1; numpy ints are ints."""
    return require_int(keep, "save_sharded: keep", CheckpointError, minimum=1, allowed="an int >= 1 (versions to keep)")


def json_problem(value: Any, where: str, depth: int = 0) -> str | None:
    """What keeps ``value`` from coming back from JSON equal to itself, or None: only dicts with
    str keys, lists, str, bool, None, ints and finite floats do."""
    if depth > 64:
        return f"{where} nests deeper than 64 levels"
    if value is None or isinstance(value, (bool, str)) or type(value) is int:
        return None
    if type(value) is float:
        return None if math.isfinite(value) else f"{where} is {value}, which JSON does not hold"
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                kind = type(k).__name__
                return (
                    f"{where} has the key {k!r:.50} ({kind}); JSON keys are strings, so it would load as {str(k)!r:.50}"
                )
            problem = json_problem(v, f"{where}[{k!r:.50}]", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list):
        return next((p for i, v in enumerate(value) if (p := json_problem(v, f"{where}[{i}]", depth + 1))), None)
    kind = "a tuple (it would load as a list; give a list)" if isinstance(value, tuple) else f"a {type(value).__name__}"
    return f"{where} is {kind}"


def check_extra(extra: object) -> dict[str, Any]:
    """``extra`` (None or a dict of JSON values) as the dict to store."""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise CheckpointTypeError(
            f"save_sharded: extra must be a dict or None, got {type(extra).__name__} {extra!r:.100}; give e.g. "
            "extra={'step': 5}. Nothing was written."
        )
    problem = json_problem(extra, "extra")
    if problem:
        raise CheckpointTypeError(
            f"save_sharded: extra={extra!r:.100} is not JSON that loads back as it was: {problem}. Give plain numbers, "
            "strings, lists and dicts with string keys (e.g. {'step': int(step)}, not a tensor). Nothing was written."
        )
    return extra
