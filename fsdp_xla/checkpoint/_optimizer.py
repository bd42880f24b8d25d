"""Optimizer state in a checkpoint: saving it by parameter name (`optimizer_json`), which saved
group and state each of the loading optimizer's parameters takes (`optimizer_plan`, checked
before anything loads), and loading it (`load_optimizer`).

State follows parameter names: each of the optimizer's groups takes the saved group with the
same parameters (in any order), so a reordered optimizer, or reordered groups, still gets each
parameter's own state. A state tensor is a scalar or broadcasts to its parameter (moments, and
factored ones such as Adafactor's row and column variances); other state is a number, string,
bool or None. Hyperparameters go into JSON (a one-element tensor, such as a tensor ``lr``, as its
number, and back as a tensor where the loading optimizer holds one) and are checked at load
against the loading optimizer's own: a string or NaN ``lr`` is refused, not loaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import torch

from fsdp_xla.checkpoint._arguments import json_problem
from fsdp_xla.checkpoint._format import CheckpointIndex, TensorEntry
from fsdp_xla.errors import CheckpointError, CheckpointTypeError
from mesh.checks import is_real

__all__ = ["OptimizerPlan", "load_optimizer", "optimizer_json", "optimizer_plan", "state_shape_fits"]


def state_shape_fits(shape: tuple[int, ...], param_shape: tuple[int, ...]) -> bool:
    """Whether optimizer state of ``shape`` belongs to a parameter of ``param_shape``: a scalar,
    or a shape that broadcasts to the parameter's."""
    if len(shape) > len(param_shape):
        return False
    return all(n in (1, m) for n, m in zip(reversed(shape), reversed(param_shape)))


def _hyper_json(value: Any, where: str) -> Any:
    """A hyperparameter as JSON: one-element tensors as numbers, tuples as lists."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (tuple, list)):
        return [_hyper_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    problem = json_problem(value, where)
    if problem:
        raise CheckpointTypeError(
            f"save_sharded: the optimizer's {problem}; hyperparameters are saved as JSON numbers, strings and bools. "
            "Nothing was written."
        )
    return value


def _scalar_json(value: Any, where: str) -> Any:
    """Non-tensor optimizer state as JSON: a number, string, bool or None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        return float(value)
    raise CheckpointTypeError(
        f"save_sharded: optimizer state {where} is a {type(value).__name__}; state is saved by parameter name as "
        "tensors, numbers, strings and bools (an optimizer that keeps lists of tensors, such as LBFGS's history, "
        "cannot be saved). Nothing was written."
    )


def optimizer_json(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict]:
    """(state tensors by checkpoint name ``optim/<param>/<field>``, the rest as JSON), each
    checked to load back as it is (`save_sharded` calls this before writing anything)."""
    names = {id(p): n for n, p in model.named_parameters()}
    flat = [p for g in optimizer.param_groups for p in g["params"]]
    for p in flat:
        if id(p) not in names:
            raise CheckpointError(
                f"The optimizer holds a parameter of shape {tuple(p.shape)} that the model does not: build "
                "the optimizer from this model's parameters (after wrapping it with FSDP)."
            )
    index_to_name = {i: names[id(p)] for i, p in enumerate(flat)}
    state = optimizer.state_dict()
    groups = []
    for j, group in enumerate(state["param_groups"]):
        g = {k: _hyper_json(v, f"group {j} {k!r}") for k, v in group.items() if k != "params"}
        g["params"] = [index_to_name[i] for i in group["params"]]
        groups.append(g)
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for i, pstate in state["state"].items():
        pname, param = index_to_name[i], flat[i]
        for key, value in pstate.items():
            if not isinstance(value, torch.Tensor):
                scalars.setdefault(pname, {})[key] = _scalar_json(value, f"{key!r} of {pname!r}")
            elif not state_shape_fits(tuple(value.shape), tuple(param.shape)):
                raise CheckpointTypeError(
                    f"save_sharded: optimizer state {key!r} of {pname!r} has shape {tuple(value.shape)}, neither a "
                    f"scalar nor broadcastable to the parameter's {tuple(param.shape)}, so it cannot be saved by "
                    "parameter name (LBFGS, for one, keeps one flat state for all parameters). Nothing was written."
                )
            else:
                tensors[f"optim/{pname}/{key}"] = value
    return tensors, {"param_groups": groups, "scalars": scalars, "class": optimizer_class(optimizer)}


def optimizer_class(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer's class as a checkpoint records it: a load into another class is refused."""
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_class(optimizer: torch.optim.Optimizer, saved: object) -> None:
    """Refuse an optimizer of another class than the saved one (Adam's state into SGD would load,
    silently, and train with the saved hyperparameters). Checkpoints from before the class was
    recorded have none, and are checked by their groups and state only."""
    if saved is None or saved == optimizer_class(optimizer):
        return
    raise CheckpointError(
        f"The checkpoint's optimizer is {str(saved)[:120]!r}, this one is {optimizer_class(optimizer)!r}: its state "
        "would not mean the same. Build the optimizer the checkpoint was saved with, or load without the optimizer "
        "(load_sharded(path, model)). Nothing was loaded."
    )


@dataclass(frozen=True)
class OptimizerPlan:
    """What `load_sharded` puts into an optimizer, worked out (and checked) before loading."""

    groups: list[dict[str, Any]]  # param_groups for ``optimizer.load_state_dict``
    position: dict[str, int]  # parameter name -> its index in this optimizer
    params: dict[str, torch.Tensor]  # the model's parameters by name
    tensors: list[tuple[str, str, str]]  # (index key, parameter name, state field)
    scalars: dict[str, dict[str, Any]]  # parameter name -> its non-tensor state


def optimizer_plan(optimizer: torch.optim.Optimizer, model: torch.nn.Module, saved: CheckpointIndex) -> OptimizerPlan:
    """How the checkpoint's optimizer state goes into ``optimizer``, checked against the
    checkpoint before anything is loaded.

    Raises:
        CheckpointError: no optimizer state saved, or groups / parameters that do not match.
    """
    if saved.optimizer is None:
        raise CheckpointError(
            "The checkpoint has no optimizer state; save it with save_sharded(path, model, optimizer), or load "
            "without the optimizer."
        )
    _check_class(optimizer, saved.optimizer.optimizer_class)
    current = _current_groups(optimizer, model)
    position = {n: i for i, n in enumerate(n for group in current for n in group)}
    groups = _matching_groups(current, list(saved.optimizer.param_groups), position)
    for j, (group, mine) in enumerate(zip(groups, optimizer.param_groups)):
        groups[j] = _checked_hyperparameters(j, group, mine)
    params = dict(model.named_parameters())
    tensors = _state_tensors(saved.tensors, params, position)
    scalars = {name: dict(fields) for name, fields in saved.optimizer.scalars.items()}
    for pname, fields in scalars.items():
        if pname not in position:
            raise CheckpointError(f"Optimizer state for {pname!r}, which this optimizer does not hold.")
        for field, value in fields.items():
            _check_scalar(pname, field, value)
    return OptimizerPlan(groups, position, params, tensors, scalars)


def _check_scalar(pname: str, field: str, value: Any) -> None:
    """Non-tensor state must be what `_scalar_json` writes; ``step`` a count."""
    number = is_real(value)
    if field == "step":
        ok, wanted = number and math.isfinite(value) and value >= 0, "a number >= 0"
    else:
        ok, wanted = number or value is None or isinstance(value, (bool, str)), "a number, string, bool or null"
    if not ok:
        raise CheckpointError(
            f"Optimizer state {field!r} of {pname!r} is {value!r:.80} in the checkpoint; it must be {wanted}. The "
            "checkpoint is damaged or was edited. Nothing was loaded."
        )


def _kind_problem(saved: Any, current: Any) -> str | None:
    """Why a saved hyperparameter cannot stand in for the loading optimizer's ``current`` one."""
    if isinstance(current, torch.Tensor) and current.numel() == 1:
        current = current.item()
    number = is_real(saved)
    if number and not math.isfinite(saved) and saved != current:
        return "not a finite number"
    if current is None or saved is None:
        return None  # e.g. foreach=None: torch chooses
    if isinstance(current, bool):
        return None if isinstance(saved, bool) else "not a bool"
    if isinstance(current, (int, float)):
        return None if number else "not a number"
    if isinstance(current, str):
        return None if isinstance(saved, str) else "not a string"
    if isinstance(current, (tuple, list)):
        if not isinstance(saved, (tuple, list)) or len(saved) != len(current):
            return f"not a list of {len(current)}"
        return next((p for s, c in zip(saved, current) if (p := _kind_problem(s, c))), None)
    return None


def _like(saved: Any, current: Any) -> Any:
    """``saved`` in the loading optimizer's form: a tensor where it holds one, a tuple for a list."""
    if isinstance(current, torch.Tensor) and not isinstance(saved, torch.Tensor):
        return torch.tensor(saved, dtype=current.dtype, device=current.device)
    if isinstance(saved, (tuple, list)):
        inner = current if isinstance(current, (tuple, list)) else [None] * len(saved)
        return tuple(_like(s, c) for s, c in zip(saved, inner))
    return saved


def _checked_hyperparameters(j: int, group: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """Saved group ``j`` checked against (and put in the form of) the loading optimizer's."""
    out = {}
    for key, saved in group.items():
        if key == "params":
            out[key] = saved
            continue
        problem = _kind_problem(saved, mine.get(key))
        if problem:
            raise CheckpointError(
                f"The checkpoint's optimizer group {j} has {key}={saved!r:.80}, {problem}; this optimizer has "
                f"{key}={mine.get(key)!r:.80}. The checkpoint is damaged or was edited. Nothing was loaded."
            )
        out[key] = _like(saved, mine.get(key))
    return out


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
        group = {k: v for k, v in saved.items() if k != "params"}  # tuples and tensors: `_like`
        group["params"] = [position[n] for n in members]  # this optimizer's order: torch maps by position
        groups.append(group)
    return groups


def _state_tensors(
    index: Mapping[str, TensorEntry], params: dict[str, torch.Tensor], position: dict[str, int]
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
        if not state_shape_fits(entry.shape, tuple(params[pname].shape)):
            raise CheckpointError(
                f"Optimizer state {field!r} of {pname!r} has shape {entry.shape} in the checkpoint; the "
                f"parameter has shape {tuple(params[pname].shape)} (state is a scalar or broadcasts to it)."
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
        elif value.dim() > 0:
            value = value.to(param.device)  # factored state (a row of a matrix's variances): whole on each device
        state.setdefault(plan.position[pname], {})[field] = value
    for pname, scalars in plan.scalars.items():
        state.setdefault(plan.position[pname], {}).update(scalars)
    try:  # torch builds the new state first and sets it last: a refusal here changes nothing
        optimizer.load_state_dict({"state": state, "param_groups": plan.groups})
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        raise CheckpointError(
            f"The optimizer refused the checkpoint's state ({type(e).__name__}: {str(e)[:300]}); nothing was loaded. "
            "Build the optimizer like the one that was saved."
        ) from e
