"""The advisor's second pass: per-tensor remat choices near the winner, as MaxText's tuned recipes
choose them (``remat_policy: custom``, `spmd.plan.request.custom_remat`).

The presets are searched first (`spmd.plan.advisor.search`). The winner's preset, written as the
choice it makes for each tensor a block produces (`spmd.plan.request.remat.as_custom`: ``dots`` keeps every projection on
the device, ``offload`` moves the block's input to the host, ...), is then changed one tensor at
a time (`neighbours`): a tensor it computes again is kept on the device or offloaded, one it
keeps is offloaded or computed again, and the block's input is offloaded or kept. The tensors are
those this model's blocks produce (`block_names`: its projections by MaxText's names, attention's
output with splash attention, the block's input).

Each neighbour is searched on the winner's mesh at the winner's batch and the next one up (what
a neighbour that saves memory can buy), with the first search's tools: our memory math rules out
what cannot fit, and a neighbour whose MFU ceiling (`spmd.plan.predict.ceiling`) is below the
winner's predicted MFU is not compiled. Of the rest, the ``limit`` with the highest ceilings are
compiled (ties in MaxText's name order: the block's input, attention's tensors, the MLP's); each
one left out is listed with why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from spmd.plan.advisor.advice import Candidate, Outcome
from spmd.plan.advisor.search import Leader, MeshSearch
from spmd.plan.lower.lowering import find_layer_stack
from spmd.plan.request.custom_remat import BLOCK_INPUT_NAME, CHOICES, CONTEXT_NAME, CUSTOM_PREFIX, NAMES, CustomRemat
from spmd.plan.request.remat import Remat, as_custom, projection_name

__all__ = ["Refinement", "block_names", "neighbours", "refinement", "remat_text"]

Ceiling = Callable[[str], "float | None"]


def remat_text(policy: CustomRemat) -> str:
    """``policy`` as ``--remat`` takes it: ``full`` when it keeps nothing but the block's input
    on the device (``custom:`` names no tensor)."""
    return policy.value if policy.choices else Remat.FULL.value


def block_names(module: torch.nn.Module, splash: bool) -> tuple[str, ...]:
    """MaxText's names of the tensors this model's repeated block produces, in `NAMES` order: the
    block's input, attention's output (``context``: the splash kernel's residuals, so with
    ``splash`` attention only) and each projection of a known role."""
    found = {BLOCK_INPUT_NAME} | ({CONTEXT_NAME} if splash else set())
    stack = find_layer_stack(module)
    if stack is not None:
        block = stack[1][0]
        found |= {projection_name(path) for path, m in block.named_modules() if path and not list(m.children())}
    return tuple(n for n in NAMES if n in found)


def neighbours(policy: CustomRemat, names: Sequence[str]) -> tuple[CustomRemat, ...]:
    """Every policy one tensor of ``names`` away from ``policy`` (module docstring), in the
    order of ``names`` and `CHOICES`. The block's input has two states, not three: ``device``
    and ``remat`` both keep it on the device (the scan's carry)."""
    current = dict(policy.choices)
    out: list[CustomRemat] = []
    for name in names:
        now = current.get(name, "remat")
        if name == BLOCK_INPUT_NAME:
            others = ("remat",) if now == "offload" else ("offload",)
        else:
            others = tuple(c for c in CHOICES if c != now)
        for choice in others:
            changed = {**current, name: choice}
            out.append(CustomRemat.parse(CUSTOM_PREFIX + ",".join(f"{n}={c}" for n, c in changed.items())))
    return tuple(out)


@dataclass(frozen=True)
class Refinement:
    """The second pass's work: a search for each neighbour to compile, and an `Outcome` for
    each one not compiled (with why)."""

    searches: tuple[MeshSearch, ...]
    skipped: tuple[Outcome, ...]


def refinement(
    winner: Outcome, search: MeshSearch, names: Sequence[str], batches: Sequence[int], ceiling: Ceiling, limit: int,
    floor_holds: bool,
) -> Refinement:  # fmt: skip
    """The neighbours of ``winner`` (the best plan of the first pass, found by ``search``, its
    mesh's search) to search, at most ``limit``; ``batches``: the sequences per batch shard the
    advisor tries; ``ceiling``: ``remat -> MFU ceiling``; ``floor_holds``: the winner's
    predicted program counts at least its floor of matmul FLOPs (else no ceiling rules out)."""
    c = winner.candidate
    policy = as_custom(c.remat, names)
    if policy is None or limit <= 0:
        return Refinement((), ())
    near = tuple(b for b in sorted(batches) if b >= c.per_device_batch)[:2]
    leader = Leader()
    leader.offer(winner)
    skipped: list[Outcome] = []
    ranked: list[tuple[float, int, str]] = []
    for order, text in enumerate(remat_text(n) for n in neighbours(policy, names)):
        if text in search.remats:
            continue  # a preset the first pass searched on this mesh (`full`: no tensor kept)
        top = ceiling(text)
        if floor_holds and leader.beats(top):
            skipped.append(Outcome(Candidate(c.strategy, c.mesh, near[0], text), skipped=leader.why_not(top)))  # type: ignore[arg-type]
        else:
            ranked.append((-(top if top is not None else 1.0), order, text))
    ranked.sort()
    searches = [
        MeshSearch(c.strategy, c.mesh, near, (text,), search.budget, search.predict, ceiling, leader, search.counted)
        for _, _, text in ranked[:limit]
    ]
    why = (
        f"not compiled: per-tensor variants beyond the {limit} with the highest ceilings (refine={limit}; "
        "ties in MaxText's name order)"
    )
    skipped += [Outcome(Candidate(c.strategy, c.mesh, near[0], text), skipped=why) for _, _, text in ranked[limit:]]
    return Refinement(tuple(searches), tuple(skipped))
