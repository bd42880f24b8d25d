"""Fused projections: a block's sibling projections run as one matmul over their stacked weights
(MaxText's ``fused_qkv`` and ``fused_mlp``).

MaxText's tuned recipes may project q, k and v with one kernel of shape ``[embed, 3, heads,
head_dim]``, and a gated MLP's two input projections with one of ``[embed, 2, mlp]``; its v5e 128B
script does both. The parameters are the same; the program is not: one matmul per group where
there were two or three, and under a ``tensor`` axis one windowed einsum for the group's input
gradient where each projection had its own (with its collective-permutes), which is what moves
that run's step time.

A Hugging Face block keeps the projections apart (``q_proj``, ``k_proj``, ``v_proj``; ``gate_proj``,
``up_proj``). With ``fused`` naming ``qkv`` or ``mlp``, `fused_projections` makes the first member
of each group called compute ``x @ stack(weights)`` (and the stacked biases) once, and every member
return its slice of it: no weight is copied or renamed, so the specs, the checkpoints and the
optimizer state are those of the separate projections. As in MaxText, the fused output is named
``qkv_proj`` (``mlpwi``) for the remat policy, and each slice keeps its own name
(``query_proj``, ``mlpwi_0``, ...: `spmd.plan.lower.residuals.named_projections`), so a policy
written for the separate projections keeps what it kept.

Fused q/k/v needs as many key/value heads as query heads (stacked weights of one shape), as
MaxText's ``fused_qkv`` does; a grouped-query model is refused with what to change.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from spmd.plan.errors import PlanError
from spmd.plan.request.remat import projection_name

__all__ = ["FUSIBLE", "FusionGroup", "fused_projections", "fusion_groups", "parse_fused"]

# What each fusion stacks, by MaxText's names of the projections (`projection_name`), in the
# order of the stacked dim, and the name MaxText gives the fused output.
FUSIBLE: dict[str, tuple[tuple[str, ...], str]] = {
    "qkv": (("query_proj", "key_proj", "value_proj"), "qkv_proj"),
    "mlp": (("mlpwi_0", "mlpwi_1"), "mlpwi"),
}
_WHAT = {"qkv": "separate q, k and v projections (q_proj, k_proj, v_proj)",
         "mlp": "a gated MLP's separate input projections (gate_proj, up_proj)"}  # fmt: skip


def parse_fused(value: Any) -> tuple[str, ...]:
    """``value`` (``"qkv,mlp"``, an iterable of those names, or ``None``/``""`` for none) as the
    fusions it names, in `FUSIBLE`'s order.

    Raises:
        PlanError: a name is not in `FUSIBLE`, or repeats.
    """
    if value is None or value == "":
        return ()
    items = value.split(",") if isinstance(value, str) else value
    try:
        names = [n.strip() if isinstance(n, str) else n for n in items]
    except TypeError:
        names = [value]
    unknown = [n for n in names if n not in FUSIBLE]
    if unknown or len(set(names)) != len(names):
        what = f"unknown {unknown[0]!r:.40}" if unknown else "a repeated name"
        raise PlanError(
            f"fused takes {' and '.join(FUSIBLE)} (MaxText's fused_qkv, fused_mlp), comma-separated, each once: "
            f"got {value!r:.60} ({what})."
        )
    return tuple(n for n in FUSIBLE if n in names)


@dataclass(frozen=True, eq=False)
class FusionGroup:
    """One group of sibling projections run as one matmul: which fusion (``qkv`` or ``mlp``) and
    its members, in the stacked order (`FUSIBLE`)."""

    kind: str
    members: tuple[torch.nn.Linear, ...]


def fusion_groups(model: torch.nn.Module, fused: tuple[str, ...]) -> list[FusionGroup]:
    """The groups of ``model`` the fusions in ``fused`` stack: for each module, its ``nn.Linear``
    children named as a fusion's members (`FUSIBLE`), when it has them all.

    Raises:
        PlanError: a fusion finds no group in ``model``, or a group's weights (or biases) differ in
            shape, which one stacked weight cannot hold (fused q/k/v under grouped-query attention).
    """
    groups: list[FusionGroup] = []
    for parent in model.modules():
        by_name = {projection_name(n): m for n, m in parent.named_children() if isinstance(m, torch.nn.Linear)}
        for kind in fused:
            names = FUSIBLE[kind][0]
            if all(n in by_name for n in names):
                groups.append(_checked(FusionGroup(kind, tuple(by_name[n] for n in names)), model))
    for kind in fused:
        if not any(g.kind == kind for g in groups):
            raise PlanError(
                f"fused {kind}: {type(model).__name__} has no block with {_WHAT[kind]} to fuse (they may be one "
                f"projection already, as GPT-2's c_attn and c_fc). Plan without {kind} in fused (--fused)."
            )
    return groups


def _checked(group: FusionGroup, model: torch.nn.Module) -> FusionGroup:
    shapes = [tuple(m.weight.shape) for m in group.members]
    biased = {m.bias is not None for m in group.members}
    if len(set(shapes)) == 1 and len(biased) == 1:
        return group
    if group.kind == "qkv" and len(biased) == 1:
        q, kv = shapes[0][0], shapes[1][0]
        raise PlanError(
            f"fused qkv: {type(model).__name__}'s query projection has {q} outputs and its key/value projections "
            f"{kv} (grouped-query attention), which one stacked weight cannot hold; MaxText's fused_qkv takes "
            "only as many key/value heads as query heads. Plan without qkv in fused (--fused)."
        )
    raise PlanError(
        f"fused {group.kind}: {type(model).__name__}'s projections to fuse differ (weights {shapes}, "
        f"{'some' if len(biased) > 1 else 'all'} with a bias), which one stacked weight cannot hold. "
        f"Plan without {group.kind} in fused (--fused)."
    )


@contextlib.contextmanager
def fused_projections(groups: Iterable[FusionGroup], env: Any) -> Iterator[None]:
    """Inside, each group's members return their slices of one matmul over their stacked weights
    (module docstring), the fused output named for the remat policy through ``env`` (the plan's
    torchax environment). The members' own forwards come back on exit, and what the traces held is
    dropped."""
    shared: list[dict[str, Any]] = []
    members: list[torch.nn.Module] = []
    for group in groups:
        last: dict[str, Any] = {}
        for index, member in enumerate(group.members):
            member.forward = functools.partial(_slice_of_fused, group, index, last, env)  # type: ignore[method-assign]
            members.append(member)
        shared.append(last)
    try:
        yield
    finally:
        for member in members:
            member.__dict__.pop("forward", None)
        for last in shared:
            last.clear()


def _slice_of_fused(group: FusionGroup, index: int, last: dict[str, Any], env: Any, x: torch.Tensor) -> torch.Tensor:
    """Member ``index``'s output: its slice of the group's matmul on ``x``, computed by the first
    member called on ``x`` (the weights read at call time: a scan's reparametrized ones)."""
    from jax.ad_checkpoint import checkpoint_name

    if last.get("input") is not x:
        weight = torch.stack([m.weight for m in group.members])  # [members, out, in]
        out = torch.einsum("...i,koi->...ko", x, weight)
        if group.members[0].bias is not None:
            out = out + torch.stack([m.bias for m in group.members])  # type: ignore[misc]
        last["input"], last["output"] = x, env.j2t_iso(checkpoint_name(env.t2j_iso(out), FUSIBLE[group.kind][1]))
    return last["output"][..., index, :]
