"""The parameters of a sharded model, summed for the report: their bytes whole and per rank,
ZeRO-3's bounds for them, and the uneven splits that FSDP pads.

ZeRO-3 (as benchmarks/fsdp_memory.py reports it): a rank holds 16 bytes of weights, gradients
and Adam state per fp32 parameter over the ranks that shard it (4 P / N of P parameter bytes),
and sends at least 3 P (N - 1) / N per step with ring collectives (gather in forward, gather in
backward, reduce-scatter the gradients).

FSDP2 splits a dim into ``ceil(size / n)`` rows per rank and pads the last ranks: a weight of
256 rows over 1,024 ranks takes one row on each, so its all-gather moves 1,024 rows, 4x the
weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["PaddedParameter", "ParameterSummary", "summarize_parameters"]


@dataclass(frozen=True)
class PaddedParameter:
    """A parameter split unevenly: ``dim`` of ``shape`` over ``ranks`` ranks, padded."""

    name: str
    shape: tuple[int, ...]
    dim: int
    ranks: int
    padding_bytes: int  # the rows added to its all-gather, over all ranks


@dataclass(frozen=True)
class ParameterSummary:
    """The model's parameters, for the ZeRO bounds and the padding warning.

    Attributes:
        count: parameters (elements) of the whole model.
        global_bytes: their bytes unsharded.
        zero3_state_bytes: ZeRO-3's per-rank weights + gradients + Adam state (4x parameter
            bytes over the ranks sharding each).
        zero3_sent_bytes: ZeRO-3's minimum bytes one rank sends per step.
        padded: the unevenly split parameters.
    """

    count: int
    global_bytes: int
    zero3_state_bytes: int
    zero3_sent_bytes: int
    padded: tuple[PaddedParameter, ...]


def _splits(p: torch.Tensor) -> list[tuple[int, int]]:
    """(tensor dim, ranks) of each sharded mesh dim of a DTensor parameter, outermost first."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return []
    # A split is a placement with a dim: Shard, and _StridedShard (FSDP over a TP split of the
    # same dim), which is no Shard and whose is_shard() is False.
    return [
        (placement.dim, p.device_mesh.size(mesh_dim))  # type: ignore[attr-defined]
        for mesh_dim, placement in enumerate(p.placements)
        if isinstance(getattr(placement, "dim", None), int)
    ]


def summarize_parameters(root: torch.nn.Module) -> ParameterSummary:
    """The `ParameterSummary` of ``root``'s parameters (DTensors or plain tensors)."""
    count = total = state = sent = 0
    padded: list[PaddedParameter] = []
    for name, p in root.named_parameters():
        nbytes = p.numel() * p.element_size()
        splits = _splits(p)
        shards = math.prod(n for _, n in splits)
        count, total, state = count + p.numel(), total + nbytes, state + 4 * nbytes // shards
        if splits:  # FSDP is the outermost split (fully_shard over a TP-sharded weight)
            fsdp = splits[0][1]
            sent += 3 * (nbytes * fsdp // shards) * (fsdp - 1) // fsdp
        shape = tuple(p.shape)
        for dim, ranks in splits:
            rows = math.ceil(shape[dim] / ranks) * ranks
            if rows != shape[dim]:
                row_bytes = nbytes // max(shape[dim], 1)
                padded.append(PaddedParameter(name, shape, dim, ranks, (rows - shape[dim]) * row_bytes))
    return ParameterSummary(count, total, state, sent, tuple(padded))
