"""`context_parallel`: every attention of a model computes the right result with the sequence split
over a mesh axis, and `ContextParallel.shard_batch` splits a batch's sequences to match.

The model is left as it is: while any of its modules runs (forward, and the recompute of an
activation-checkpointed block in backward), calls to ``scaled_dot_product_attention`` are taken
by a function mode and computed with the sequence split. Every other op of a transformer is
token-wise, so it needs nothing: each shard runs it on its tokens.

The strategy is MaxText's default, ``all_gather``: queries stay split by sequence, keys and values
are gathered over the context axis once per attention (their gradients reduce-scattered in
backward), and each shard attends its queries to every key it may see. On the dtensor backend
(one process per device: CPU with gloo, TorchTPU, GPUs) the gather is a collective over the
axis's process group and the attention runs tile by tile (`_blockwise`), so no ``[queries, keys]``
matrix is formed. On torch_xla (GSPMD) the tensors are global: queries are annotated split over
the axis, keys and values whole along it, and GSPMD inserts the gather; the causal mask is built
for the load-balanced order.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from mesh import Mesh, Role, mesh_or_global, roles
from spmd._backend import backend_for, torch_xla_backend
from spmd._backend.agreement import agree_on_arguments, mesh_text
from spmd._backend.dtensor_context import all_gather_dim, axis_coordinate
from spmd.context._batch import shard_batch
from spmd.context._blockwise import span_attention
from spmd.context._order import SequenceOrder
from spmd.context._transformers import adapt
from spmd.errors import ContextParallelError, SpmdTypeError, UnknownAxisError, UnsupportedAttentionError
from spmd.mark_sharding import with_sharding_constraint
from spmd.sharding import P

__all__ = ["STRATEGIES", "ContextParallel", "context_parallel"]

STRATEGIES = ("all_gather",)
SAME_PLAN = (
    "Call context_parallel with the same mesh, axis, strategy and load_balance on every rank (one rank runs a "
    "stale config?): the ranks' attention gathers must meet."
)


@lru_cache(maxsize=64)
def _order(seq_len: int, context: int, load_balance: bool) -> SequenceOrder:
    return SequenceOrder(seq_len, context, load_balance)


class _AttentionMode(TorchFunctionMode):
    """Takes ``scaled_dot_product_attention`` calls to the plan while the model runs, and on
    torch_xla the ``linear`` calls on the batch's tokens (`ContextParallel._linear`)."""

    def __init__(self, plan: ContextParallel) -> None:
        super().__init__()
        self.plan = plan

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is F.scaled_dot_product_attention:
            return self.plan._attention(*args, **(kwargs or {}))
        if func is F.linear and self.plan._takes_linear(args[0] if args else kwargs["input"]):
            return self.plan._linear(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class ContextParallel:
    """What `context_parallel` returns: the plan of one model's context parallelism.

    Attributes:
        mesh: the mesh.
        axis: the mesh axis the sequence is split over.
        size: the number of context shards (the axis's size).
        strategy: ``"all_gather"``.
        load_balance: whether shards hold head-tail chunk pairs (`SequenceOrder`).
    """

    def __init__(self, model: torch.nn.Module, mesh: Mesh, axis: str, strategy: str, load_balance: bool) -> None:
        self.mesh, self.axis, self.strategy, self.load_balance = mesh, axis, strategy, load_balance
        self.size = mesh.axis_size(axis)
        self._backend = backend_for(None)
        self._local = threading.local()
        self._mode = _AttentionMode(self)
        self._tokens: tuple[int, int] | None = None  # torch_xla: the (rows, seq) of the batch shard_batch laid out
        self._hooks = [h for name, m in model.named_modules() for h in self._watch(_label(name, m), m)]
        self._restore_attention = adapt(model)  # a transformers model: no mask of its own, one SDPA call

    def __repr__(self) -> str:
        return (
            f"ContextParallel({self.mesh.describe()}, axis={self.axis!r}, strategy={self.strategy!r}, "
            f"load_balance={self.load_balance}, backend={self._backend.name!r})"
        )

    def order(self, seq_len: int) -> SequenceOrder:
        """The order a ``seq_len``-token sequence is split in (`SequenceOrder`).

        Raises:
            SequenceLengthError: ``seq_len`` does not split into the shards' chunks.
        """
        return _order(seq_len, self.size, self.load_balance)

    def remove(self) -> None:
        """Stop taking the model's attention calls (the model computes as before)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._restore_attention is not None:
            self._restore_attention()
            self._restore_attention = None

    # While the model runs -------------------------------------------------------------------

    def _watch(self, name: str, module: torch.nn.Module) -> list[Any]:
        def enter(*_: object) -> None:
            stack = self._stack()
            if not stack:
                self._mode.__enter__()
            stack.append(name)

        def leave(module: torch.nn.Module, args: object, output: Any) -> Any:
            stack = self._stack()
            stack.pop()
            if not stack:
                self._mode.__exit__(None, None, None)
            return self._laid_out(output) if self._tokens is not None else None

        return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]

    def _laid_out(self, output: Any) -> Any:
        """torch_xla: a module's ``[batch, seq, ...]`` outputs annotated split over the batch axes
        and the context axis, as MaxText's activation rules do. Without them GSPMD is free to
        gather a block's activations along the sequence (it gathered the attention output before
        its projection, and recomputed the projection on every context device)."""
        if isinstance(output, tuple):
            return tuple(self._laid_out(o) for o in output)
        if not isinstance(output, torch.Tensor) or output.dim() < 2 or tuple(output.shape[:2]) != self._tokens:
            return output
        spec = [roles.batch_axes(self.mesh.axis_names) or None, self.axis] + [None] * (output.dim() - 2)
        return with_sharding_constraint(output, self.mesh, P(*spec))

    def _takes_linear(self, x: torch.Tensor) -> bool:
        return self._tokens is not None and x.dim() > 2 and tuple(x.shape[:2]) == self._tokens

    def _linear(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:  # noqa: A002
        """torch_xla: a linear layer on the batch's ``[rows, seq, ...]`` tokens as one einsum, so
        rows keep their split over the batch axes and tokens theirs over the context axis (the
        flattening ``linear`` lowers to gathered the sequence, forward and for the weight's
        gradient: `spmd._backend.torch_xla_backend.linear`)."""
        return torch_xla_backend.einsum_linear(input, weight, bias)

    def _stack(self) -> list[str]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def _attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        self._check_call(query, key, attn_mask, dropout_p)
        scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
        if self._backend.name == "dtensor":
            return self._local_attention(query, key, value, bool(is_causal), scale)
        return self._global_attention(query, key, value, bool(is_causal), scale)

    def _check_call(self, query: torch.Tensor, key: torch.Tensor, mask: object, dropout: float) -> None:
        where = f"{self._stack()[-1]} calls scaled_dot_product_attention"
        problem = None
        if mask is not None:
            problem = (
                f"with an explicit attn_mask (shape {tuple(getattr(mask, 'shape', ()))}): a mask made from one shard's "
                "tokens does not describe the split sequence. Call it with is_causal=True (a causal LM) or no mask, "
                "and pad on the right with the padding's labels ignored (a causal query never sees later tokens)"
            )
        elif dropout:
            problem = f"with dropout_p={dropout}: attention dropout is not split with the sequence. Set it to 0"
        elif query.shape[-2] != key.shape[-2]:
            problem = (
                f"with {query.shape[-2]} queries and {key.shape[-2]} keys (cross-attention or a KV cache): the "
                "strategy splits one sequence for both. Run that module without context parallelism"
            )
        elif query.dim() != 4 or query.shape[1] % key.shape[1]:
            problem = (
                f"with query {tuple(query.shape)} and key {tuple(key.shape)}: it takes [batch, heads, seq, head_dim] "
                "with query heads a multiple of key/value heads"
            )
        if problem:
            raise UnsupportedAttentionError(f"Context parallelism ({self.strategy}): {where} {problem}.")

    def _local_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):  # noqa: ANN202
        """This process's queries against every shard's keys (the dtensor backend)."""
        group, shard = self.group(), self.shard_index()
        order = self.order(q.shape[2] * self.size)
        restore = order.restore.to(k.device)
        k, v = (all_gather_dim(t, group, 2).index_select(2, restore) for t in (k, v))
        return span_attention(q, k, v, order.spans(shard), causal=causal, scale=scale)

    def _global_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):  # noqa: ANN202
        """The whole sequence's attention, annotated so that GSPMD splits the queries (torch_xla).

        Written per query-head group rather than as ``scaled_dot_product_attention`` (which
        repeats keys and values for every query head first): the gradients of keys and values
        are then reduced over the context axis at their own size, not ``heads / kv_heads`` times it.
        """
        order = self.order(q.shape[2])
        batch = roles.batch_axes(self.mesh.axis_names) or None
        tensor = roles.tensor_axes(self.mesh.axis_names)
        heads = tensor[0] if tensor and k.shape[1] % self.mesh.axis_size(tensor[0]) == 0 else None
        q = with_sharding_constraint(q, self.mesh, P(batch, heads, self.axis, None))
        k, v = (with_sharding_constraint(t, self.mesh, P(batch, heads, None, None)) for t in (k, v))
        restore = order.restore.to(k.device)
        k, v = (t.index_select(2, restore) for t in (k, v))  # token order: the keys are whole here
        b, h, s, d = q.shape
        grouped = q.view(b, k.shape[1], h // k.shape[1], s, d)
        scores = torch.einsum("bhgqd,bhkd->bhgqk", grouped, k).float() * scale
        scores = with_sharding_constraint(scores, self.mesh, P(batch, heads, None, self.axis, None))
        if causal:  # query i (at position indices[i]) sees the keys at or before it, in token order
            positions = order.indices.to(q.device)
            mask = positions[:, None] >= torch.arange(s, device=q.device)[None, :]
            scores = scores.masked_fill(~with_sharding_constraint(mask, self.mesh, P(self.axis, None)), float("-inf"))
        out = torch.einsum("bhgqk,bhkd->bhgqd", scores.softmax(-1).to(v.dtype), v).reshape(b, h, s, d)
        return with_sharding_constraint(out, self.mesh, P(batch, heads, self.axis, None))

    # Batches --------------------------------------------------------------------------------

    def shard_batch(
        self,
        batch: torch.Tensor | Mapping[str, torch.Tensor],
        *,
        seq_dim: int = 1,
        positions: str | None = "position_ids",
        rows: str = "global",
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Split a batch's sequences over the context axis (and, from a global batch, its rows over
        the batch axes).

        ``batch`` is a tensor or a dict of tensors (``input_ids``, ``labels``...), each ``[batch,
        seq, ...]`` with the sequence along ``seq_dim``. ``rows="global"``: it is the whole global
        batch, the same on every process; ``rows="local"``: it is this process's rows already (a
        per-process loader's), whole sequences. On the dtensor backend each process gets its block:
        its rows (by its coordinates on the batch axes, `mesh.roles`) and its tokens in the shard
        order; on torch_xla (one process: global and local rows are one batch) the whole batch in
        the shard order, laid out over the mesh (a batch already split over the batch axes keeps
        that). A dict also gets ``positions`` (default ``"position_ids"``): each token's position in
        its sequence, which a model with rotary or learned position embeddings must be given.

        Raises:
            SequenceLengthError: the sequence does not split into the shards' chunks.
            ContextParallelError: tensors of different rows or sequence lengths, a tensor already
                laid out otherwise (a DTensor, an XLA tensor split along another dim), or
                ``rows`` other than ``"global"`` and ``"local"``.
            IndivisibleBatchError: the global batch's rows do not split over the batch axes.
        """
        return shard_batch(self, batch, seq_dim, positions, rows)

    def unshard(self, t: torch.Tensor, *, seq_dim: int = 1) -> torch.Tensor:
        """The tokens of ``t`` (a tensor `shard_batch` split, or a model output made from one)
        back in sequence order and whole along the sequence: on the dtensor backend every
        context shard's part gathered (rows stay this process's); on torch_xla reordered."""
        if self._backend.name == "dtensor":
            t = all_gather_dim(t, self.group(), seq_dim)
        return t.index_select(seq_dim, self.order(t.shape[seq_dim]).restore.to(t.device))

    @property
    def backend(self) -> str:
        """The backend the plan runs on: ``"dtensor"`` or ``"torch_xla"``."""
        return self._backend.name

    @property
    def device(self) -> torch.device:
        """The device this process computes on (``cpu`` with gloo, ``cuda:i``, ``xla:0``...)."""
        return self._backend.compute_device()

    def group(self) -> Any:
        """The context axis's process group (dtensor backend): this process's context peers."""
        return self._backend.device_mesh(self.mesh).get_group(self.axis)

    def shard_index(self) -> int:
        """This process's coordinate on the context axis (dtensor backend)."""
        return axis_coordinate(self._backend.device_mesh(self.mesh), self.axis)


def _label(name: str, module: torch.nn.Module) -> str:
    """A module as an error names it: its path in the model and its class (the root: its class)."""
    return f"{name} ({type(module).__name__})" if name else type(module).__name__


def context_parallel(
    model: torch.nn.Module,
    mesh: Mesh | None = None,
    *,
    axis: str = Role.CONTEXT.value,
    strategy: str = "all_gather",
    load_balance: bool = True,
) -> ContextParallel:
    """Split the sequence of every attention in ``model`` over mesh axis ``axis``.

    ``scaled_dot_product_attention`` calls made while ``model`` runs compute their queries'
    attention over the whole sequence with each shard holding ``1 / size`` of the tokens
    (causal masks, grouped-query attention and gradients included). Feed the model batches from
    `ContextParallel.shard_batch`, with their ``position_ids``. Shard the parameters with FSDP
    over the batch axes and ``axis`` (`fsdp_xla`; `mesh.ParallelDims` names them), which also
    averages every shard's gradients.

    Args:
        model: the model (any ``nn.Module``; its attention must go through
            ``torch.nn.functional.scaled_dot_product_attention``).
        mesh: the mesh; ``None`` uses the global mesh.
        axis: the mesh axis the sequence is split over (``"context"``).
        strategy: ``"all_gather"`` (MaxText's default): keys and values gathered once per
            attention, queries kept split.
        load_balance: give each shard a head and a tail chunk of the sequence, so causal
            attention costs every shard the same (the sequence must divide by ``2 x size``).

    Returns:
        The plan: `ContextParallel.shard_batch` splits batches, `ContextParallel.unshard`
        joins outputs, `ContextParallel.remove` restores plain attention.

    Raises:
        NoMeshError: no mesh and no global mesh.
        UnknownAxisError: the mesh has no axis ``axis``.
        ContextParallelError: an unknown strategy.
        SpmdTypeError: ``model`` is not a module, ``load_balance`` not a bool.
        RankDisagreementError: with several processes, the ranks passed different arguments, or
            one rank's were refused (every rank raises it at once).

    Example:
        >>> dims = mesh.ParallelDims(fsdp=2, context=2)                     # doctest: +SKIP
        >>> cp = spmd.context_parallel(model, dims.mesh())                  # doctest: +SKIP
        >>> batch = cp.shard_batch({"input_ids": tokens, "labels": labels})  # doctest: +SKIP
        >>> loss = model(**batch).loss                                      # doctest: +SKIP
    """
    fields = {
        "model": type(model).__name__,
        "mesh": mesh_text(mesh),
        "axis": repr(axis),
        "strategy": repr(strategy),
        "load_balance": repr(load_balance),
    }
    # every rank checks, then all agree: a rank refusing alone no longer leaves the others to a timeout
    checked = lambda: _checked_mesh(model, mesh, axis, strategy, load_balance)  # noqa: E731
    mesh = agree_on_arguments(backend_for(None), "context_parallel", fields, checked, SAME_PLAN)
    return ContextParallel(model, mesh, axis, strategy, load_balance)


def _checked_mesh(model: object, mesh: Mesh | None, axis: object, strategy: object, load_balance: object) -> Mesh:
    """`context_parallel`'s own checks of its arguments; the mesh to use."""
    if not isinstance(model, torch.nn.Module):
        raise SpmdTypeError(f"context_parallel takes an nn.Module, got {type(model).__name__}.")
    if not isinstance(load_balance, bool):
        raise SpmdTypeError(f"context_parallel's load_balance takes True or False, got {load_balance!r:.60}.")
    mesh = mesh_or_global(mesh, "context_parallel")
    if axis not in (mesh.axis_names or ()):
        raise UnknownAxisError(
            f"context_parallel splits the sequence over mesh axis {axis!r}, but {mesh.describe()} has axes "
            f"{tuple(mesh.axis_names or ())}. Build the mesh with that axis, e.g. "
            f"mesh.ParallelDims(fsdp=2, context=2).mesh(), or pass axis=<one of its axes>."
        )
    if strategy not in STRATEGIES:
        raise ContextParallelError(
            f"context_parallel strategy {strategy!r} is not one of {STRATEGIES}. 'all_gather' (MaxText's default) "
            "runs on every backend and device."
        )
    return mesh
