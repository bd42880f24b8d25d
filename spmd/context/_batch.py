"""Batches under context parallelism: each process's block of a batch, in the shard order.

A batch's rows split over the batch axes (`mesh.roles`: data, fsdp) and its sequences over the
context axis, each shard's tokens in `SequenceOrder`'s order. On the dtensor backend a process
keeps its block as a plain tensor (the model computes on it as on any rows); on torch_xla the one
process keeps the whole batch, reordered and annotated with the layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from mesh import roles
from spmd.context._order import SequenceOrder
from spmd.errors import ContextParallelError
from spmd.mark_sharding import get_sharding, mark_sharding
from spmd.multiprocess import process_rows
from spmd.sharding import P, hlo_sharding_for

if TYPE_CHECKING:
    from spmd.context._parallel import ContextParallel

__all__ = ["shard_batch"]

ROWS = ("global", "local")


def shard_batch(
    plan: ContextParallel,
    batch: torch.Tensor | Mapping[str, torch.Tensor],
    seq_dim: int,
    positions: str | None,
    rows: str,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """`ContextParallel.shard_batch`."""
    if rows not in ROWS:
        raise ContextParallelError(f"shard_batch: rows takes one of {ROWS}, got {rows!r:.60}.")
    tensors = {"": batch} if isinstance(batch, torch.Tensor) else dict(batch)
    count, seq_len = _batch_shape(plan, tensors, seq_dim)
    order = plan.order(seq_len)
    if plan.backend != "dtensor":
        plan._tokens = (count, seq_len)  # the model's activations of this batch get its layout
    if positions is not None and not isinstance(batch, torch.Tensor):
        device = next(iter(tensors.values())).device
        tensors[positions] = torch.arange(seq_len, device=device).expand(count, seq_len)
    out = {k: _shard(plan, t, order, seq_dim if k != positions else 1, rows) for k, t in tensors.items()}
    return out[""] if isinstance(batch, torch.Tensor) else out


def _batch_shape(plan: ContextParallel, tensors: dict[str, Any], seq_dim: int) -> tuple[int, int]:
    shapes = {}
    for key, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dim() <= seq_dim:
            raise ContextParallelError(
                f"shard_batch: {key or 'the batch'} must be a tensor of [batch, seq, ...] with the sequence along "
                f"dim {seq_dim}, got {type(t).__name__} {tuple(getattr(t, 'shape', ()))}."
            )
        layout = _layout_of(plan, t)
        if layout is not None:
            raise ContextParallelError(
                f"shard_batch: {key or 'the batch'} is already laid out ({layout}): pass the batch as a plain tensor "
                "(on the host; on torch_xla, split over the batch axes at most), and shard_batch splits its sequence."
            )
        shapes[key] = (t.shape[0], t.shape[seq_dim])
    if len(set(shapes.values())) > 1:
        raise ContextParallelError(
            f"shard_batch: the tensors differ in rows or sequence length: {shapes}; give every key the same "
            "[batch, seq]."
        )
    return next(iter(shapes.values()))


def _layout_of(plan: ContextParallel, t: torch.Tensor) -> str | None:
    """How ``t`` is laid out over devices already, where that is not a batch split over the
    batch axes; ``None`` for a plain tensor or that split."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return f"a DTensor with placements {list(t.placements)}"
    if t.device.type != "xla":
        return None
    sharding = get_sharding(t)
    by_rows = hlo_sharding_for(plan.mesh, P(roles.batch_axes(plan.mesh.axis_names) or None), t.dim())
    if sharding is None or sharding.is_replicated or sharding == by_rows:
        return None
    return f"an XLA tensor sharded {sharding}"


def _shard(plan: ContextParallel, t: torch.Tensor, order: SequenceOrder, seq_dim: int, rows: str) -> torch.Tensor:
    batch_axes = roles.batch_axes(plan.mesh.axis_names)
    if plan.backend == "dtensor":
        if rows == "global":
            t = t[process_rows(plan.mesh, P(batch_axes or None), t.shape[0])]
        local = t.index_select(seq_dim, order.positions(plan.shard_index()).to(t.device))
        return local.to(plan.device)
    spec = [None] * t.dim()
    spec[0], spec[seq_dim] = batch_axes or None, plan.axis
    placed = t.index_select(seq_dim, order.indices.to(t.device)).to(plan.device)
    mark_sharding(placed, plan.mesh, P(*spec))  # in place on torch_xla: a plain tensor, as a loader gives
    return placed
