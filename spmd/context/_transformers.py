"""Hugging Face models under context parallelism: their attention made an SDPA call with no mask.

A transformers model builds its attention mask from the tokens it is given, and with the
sequence split those are one shard's: a causal mask of the shard alone, or (since its
``position_ids`` jump between a shard's head and tail chunk) a "packed sequences" block mask. So
the model is switched to an attention implementation of ours, registered with transformers'
``AttentionInterface`` and ``AttentionMaskInterface``: no mask is built, and attention is one
``scaled_dot_product_attention`` call, causal as the module says, which `ContextParallel` then
computes over the whole sequence. transformers is imported only for a model that is one of its.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from spmd.errors import UnsupportedAttentionError

__all__ = ["IMPLEMENTATION", "adapt"]

IMPLEMENTATION = "spmd_context_parallel"


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    out = F.scaled_dot_product_attention(
        query, key, value, dropout_p=dropout, is_causal=causal, scale=scaling, enable_gqa=key.shape[1] != query.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, local_size: int | None = None, attention_mask: torch.Tensor | None = None, **kwargs: Any):  # noqa: ANN202
    """No mask: causality is the attention call's ``is_causal``. A window or a padding mask
    cannot be left out, so they are refused."""
    if local_size is not None:
        raise UnsupportedAttentionError(
            f"Context parallelism: this model uses sliding-window attention (window {local_size}), which the "
            "strategy does not split. Run it without context parallelism."
        )
    if attention_mask is not None and not bool(attention_mask.all()):
        raise UnsupportedAttentionError(
            "Context parallelism: the model was given an attention_mask that masks tokens, which a shard cannot "
            "apply to the others' keys. Drop it: pad on the right and give the padding the label -100 (a causal "
            "query never sees later tokens)."
        )
    return None


def adapt(model: torch.nn.Module) -> Callable[[], None] | None:
    """Switch a transformers model to the attention of this module; returns what restores its
    own (``None`` for a model that is not a transformers one)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation") or not hasattr(config, "_attn_implementation"):
        return None
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(IMPLEMENTATION, _no_mask)
    previous = config._attn_implementation
    model.set_attn_implementation(IMPLEMENTATION)
    return lambda: model.set_attn_implementation(previous)
