"""Optimizer state in a checkpoint: which saved group and state each of the loading optimizer's
parameters takes, by parameter name (`optimizer_plan`, checked before anything loads), and
loading it (`load_optimizer`).

State follows parameter names: each of the optimizer's groups takes the saved group with the
same parameters (in any order), so a reordered optimizer, or reordered groups, still gets each
parameter's own state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fsdp_xla.errors import CheckpointError

__all__ = ["OptimizerPlan", "load_optimizer", "optimizer_plan"]


@dataclass(frozen=True)
class OptimizerPlan:
    """What `load_sharded` puts into an optimizer, worked out (and checked) before loading."""

    groups: list[dict[str, Any]]  # param_groups for ``optimizer.load_state_dict``
    position: dict[str, int]  # parameter name -> its index in this optimizer
    params: dict[str, torch.Tensor]  # the model's parameters by name
    tensors: list[tuple[str, str, str]]  # (index key, parameter name, state field)
    scalars: dict[str, dict[str, Any]]  # parameter name -> its non-tensor state


def optimizer_plan(optimizer: torch.optim.Optimizer, model: torch.nn.Module, meta: dict, index: dict) -> OptimizerPlan:
    """How the checkpoint's optimizer state goes into ``optimizer``, checked against the
    checkpoint before anything is loaded.

    Raises:
        CheckpointError: no optimizer state saved, or groups / parameters that do not match.
    """
    optim_json = meta.get("optimizer") or {}
    if not optim_json:
        raise CheckpointError(
            "The checkpoint has no optimizer state; save it with save_sharded(path, model, optimizer), or load "
            "without the optimizer."
        )
    current = _current_groups(optimizer, model)
    position = {n: i for i, n in enumerate(n for group in current for n in group)}
    groups = _matching_groups(current, optim_json["param_groups"], position)
    params = dict(model.named_parameters())
    tensors = _state_tensors(index, params, position)
    scalars = optim_json.get("scalars", {})
    for pname in scalars:
        if pname not in position:
            raise CheckpointError(f"Optimizer state for {pname!r}, which this optimizer does not hold.")
    return OptimizerPlan(groups, position, params, tensors, scalars)


def _current_groups(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[list[str]]:
    """The loading optimizer's groups as lists of the model's parameter names."""
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
    return current


def _matching_groups(current: list[list[str]], saved_groups: list[dict], position: dict[str, int]) -> list[dict]:
    """Each current group with the hyperparameters of the saved group of the same members."""
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
    return groups


def _state_tensors(
    index: dict, params: dict[str, torch.Tensor], position: dict[str, int]
) -> list[tuple[str, str, str]]:
    """(index key, parameter name, field) of every saved optimizer tensor, each checked."""
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
    return tensors


def load_optimizer(
    optimizer: torch.optim.Optimizer,
    plan: OptimizerPlan,
    read: Callable[[str], torch.Tensor],
    place: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    """Load ``plan`` into ``optimizer``: ``read(key)`` gives a saved tensor whole, ``place(param,
    value)`` lays a parameter-shaped one out as the parameter is."""
    state: dict[int, dict[str, Any]] = {}
    for key, pname, field in plan.tensors:
        value = read(key)
        param = plan.params[pname]
        if tuple(value.shape) == tuple(param.shape) and value.dim() > 0:
            value = place(param, value)  # in the parameter's dtype and layout
        state.setdefault(plan.position[pname], {})[field] = value
    for pname, scalars in plan.scalars.items():
        state.setdefault(plan.position[pname], {}).update(scalars)
    optimizer.load_state_dict({"state": state, "param_groups": plan.groups})
