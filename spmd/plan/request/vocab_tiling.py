"""Vocabulary tiling: the loss computed over the tokens in chunks, so the step never holds the
``[tokens, vocab]`` logits (MaxText's ``num_vocab_tiling``, ``vocabulary_tiling.py``).

A causal LM's loss projects every token's final hidden state onto the vocabulary and takes the
cross-entropy in fp32: at Llama 3's 128,256-token vocabulary and 40,960 tokens a device that is
one ``f32[40960, 128256]`` buffer, 19.6 GiB (and its bf16 logits and fp32 gradient beside it).
With ``vocab_tiles = n`` the planner asks the model for its hidden states instead (the output
embedding replaced by the identity for the call), and computes the loss as a ``lax.scan`` over
``n`` chunks of the tokens, each chunk's body checkpointed: forward keeps only each chunk's loss
sum, and backward recomputes one chunk's logits at a time, adding its share of the head's
gradient. Peak logits are ``1/n`` of the whole, for one more pass of the head's matmul (the
recomputation MaxText's custom VJP also does).

Chunks are strided over the sequence (chunk ``j`` holds positions ``j, j + n, j + 2n, ...`` of
every sequence), so each keeps the batch's sharding and, under context parallelism, the
sequence's: no chunk lives on a subset of the devices. The loss is written on the ``[batch,
seq]`` grid against the tokens as targets (MaxText's pipeline gives them shifted; a compile
needs no values), as `spmd.plan.request.context.context_token_loss` is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from spmd.plan.errors import PlanError

__all__ = ["OutputHead", "check_vocab_tiles", "hidden_states_only", "output_head", "tiled_token_loss"]

MAX_TILES = 4096


def check_vocab_tiles(tiles: Any, seq_len: int | None = None) -> None:
    """Raise `PlanError` unless ``tiles`` is a whole number from 1 to `MAX_TILES` that divides
    ``seq_len`` (each chunk takes ``seq_len / tiles`` positions of every sequence)."""
    if not isinstance(tiles, int) or isinstance(tiles, bool) or not 1 <= tiles <= MAX_TILES:
        raise PlanError(
            f"vocab_tiles must be a whole number from 1 (no tiling) to {MAX_TILES} (MaxText's num_vocab_tiling), "
            f"got {tiles!r:.60}."
        )
    if seq_len is not None and seq_len % tiles:
        raise PlanError(
            f"vocab_tiles={tiles} does not divide the sequence ({seq_len} tokens): each chunk of the loss takes "
            f"seq / tiles positions of every sequence. Give a divisor of {seq_len}."
        )


@dataclass(frozen=True)
class OutputHead:
    """Where a causal LM's output embedding is: the module's qualified name, and its weight's and
    bias's names among the model's parameters (deduplicated: a tied head's weight is the input
    embedding's name); ``bias`` is ``None`` for a head without one."""

    module: str
    weight: str
    bias: str | None


def output_head(model: torch.nn.Module) -> OutputHead:
    """The model's output embedding (`OutputHead`).

    Raises:
        PlanError: the model has no ``get_output_embeddings()`` returning a ``Linear``, or applies
            something after it the tiled loss would leave out (Gemma's logit soft-capping).
    """
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, torch.nn.Linear):
        raise PlanError(
            f"Vocabulary tiling computes the loss from the hidden states and the output embedding, and "
            f"{type(model).__name__} has no get_output_embeddings() returning a torch.nn.Linear (it gave "
            f"{type(head).__name__}). Plan it with vocab_tiles=1."
        )
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise PlanError(
                f"{type(model).__name__} applies {name}={getattr(config, name)!r} to its logits, which the planner's "
                "tiled loss does not; plan it with vocab_tiles=1."
            )
    module = next(n for n, m in model.named_modules() if m is head)
    params = list(model.named_parameters(remove_duplicate=True))
    weight = next(n for n, p in params if p is head.weight)
    bias = next((n for n, p in params if head.bias is not None and p is head.bias), None)
    return OutputHead(module, weight, bias)


@contextlib.contextmanager
def hidden_states_only(model: torch.nn.Module, head: OutputHead) -> Iterator[None]:
    """Inside, the model's output embedding is the identity: its "logits" are its final hidden states."""
    owner_name, _, attr = head.module.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    original = getattr(owner, attr)
    setattr(owner, attr, torch.nn.Identity())
    try:
        yield
    finally:
        setattr(owner, attr, original)


def tiled_token_loss(hidden: Any, weight: Any, bias: Any, targets: Any, tiles: int) -> Any:
    """Mean token cross-entropy of ``hidden @ weight.T (+ bias)`` against ``targets``, computed in
    ``tiles`` strided chunks of the sequence (module docstring).

    Args:
        hidden: ``[batch, seq, width]`` final hidden states (JAX).
        weight: ``[vocab, width]`` output embedding; ``bias``: ``[vocab]`` or ``None``.
        targets: ``[batch, seq]`` int token ids.
        tiles: chunks; divides ``seq``.
    """
    import jax
    import jax.numpy as jnp

    batch, seq, width = hidden.shape
    chunk = seq // tiles
    # [batch, seq/n, n, width] -> [n, batch, seq/n, width]: chunk j holds positions j, j+n, ...
    xs = jnp.moveaxis(hidden.reshape(batch, chunk, tiles, width), 2, 0)
    ts = jnp.moveaxis(targets.reshape(batch, chunk, tiles), 2, 0)

    @jax.checkpoint  # backward recomputes one chunk's logits at a time: none is kept
    def chunk_loss(h: Any, t: Any) -> Any:
        logits = jnp.einsum("bsd,vd->bsv", h, weight.astype(h.dtype))
        if bias is not None:
            logits = logits + bias.astype(h.dtype)
        x = logits.astype(jnp.float32)
        picked = jnp.take_along_axis(x, t[..., None], axis=-1)[..., 0]
        return jnp.sum(jax.nn.logsumexp(x, axis=-1) - picked)

    def body(total: Any, piece: tuple[Any, Any]) -> tuple[Any, None]:
        return total + chunk_loss(*piece), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (xs, ts))
    return total / (batch * seq)
