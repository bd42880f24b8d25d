"""FLOPs of training a decoder-only transformer, three ways (pure Python).

- ``6N``: the PyTorch/XLA blogs' ``6 x tokens x parameters``. It ignores attention's
  sequence-length term, so it under-counts whenever the sequence is not much shorter than
  the model width (and it counts the embedding lookup, which does no matmul).
- PaLM (arXiv:2204.02311, appendix B): ``6N + 12 L H Q T`` per token, N the parameters
  outside the embeddings (a tied token embedding is kept: it is the unembedding matmul),
  attention counted without the causal mask, as nanoGPT and torchtitan do.
- per-matmul: every matmul of the forward pass counted (QKV with grouped K/V heads, attention
  scores and values, the output projection, the MLP with its gate if any, the unembedding),
  causal attention counted once (half the square), the embedding lookup not counted, and
  backward as twice forward, as MaxText does. A sliding-window layer (Gemma 2 and 3's local
  layers, Mistral's ``sliding_window``) counts its window of keys, not the sequence, halved when
  causal: MaxText's count for Gemma 3.

A multiply-add counts as 2 FLOPs; recomputation (activation checkpointing) is not counted:
it is hardware work, not model work (MFU, not HFU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mesh.checks import require_int, require_real
from spmd.errors import MfuError, SpmdTypeError

__all__ = [
    "TransformerShape",
    "six_n_flops_per_token",
    "palm_flops_per_token",
    "matmul_flops_per_token",
    "forward_matmul_flops_per_token",
    "sliding_layers",
]


@dataclass(frozen=True)
class TransformerShape:
    """The dimensions that decide a decoder-only transformer's FLOPs.

    Attributes:
        n_layer: decoder layers (L).
        d_model: model width (D).
        n_head: query heads (H).
        head_dim: per-head width (Q).
        d_ff: MLP hidden width (F).
        vocab: vocabulary size (V).
        n_kv_head: key/value heads (grouped-query attention; H for multi-head).
        gated_mlp: the MLP has a gate projection (Llama's SwiGLU: three matrices, not two).
        n_params: all parameters, tied ones once.
        n_embedding_params: parameters of embeddings that do no matmul (position embeddings,
            an untied token embedding); excluded from N in the PaLM formula.
        sliding_window: keys a sliding-window layer attends to (``None``: no such layer).
        n_sliding_layers: how many of the ``n_layer`` layers attend over ``sliding_window``.
    """

    n_layer: int
    d_model: int
    n_head: int
    head_dim: int
    d_ff: int
    vocab: int
    n_kv_head: int
    gated_mlp: bool
    n_params: int
    n_embedding_params: int
    sliding_window: int | None = None
    n_sliding_layers: int = 0

    def __post_init__(self) -> None:
        for name in ("n_layer", "d_model", "n_head", "head_dim", "d_ff", "vocab", "n_kv_head", "n_params"):
            value = getattr(self, name)
            require_int(value, f"TransformerShape.{name}", MfuError, minimum=1, allowed="a positive int")
        if not isinstance(self.gated_mlp, bool):
            raise SpmdTypeError(f"TransformerShape.gated_mlp takes a bool, got {self.gated_mlp!r}.")
        embedding = require_int(
            self.n_embedding_params,
            "TransformerShape.n_embedding_params",
            SpmdTypeError,
            minimum=0,
            range_error=MfuError,
        )
        self._check_window()
        if embedding > self.n_params:
            raise MfuError(
                f"TransformerShape.n_embedding_params ({embedding}) exceeds n_params ({self.n_params}): "
                "the embeddings are part of the parameters (PaLM's N would go negative)."
            )

    def _check_window(self) -> None:
        if self.sliding_window is not None:
            require_int(
                self.sliding_window,
                "TransformerShape.sliding_window",
                MfuError,
                minimum=1,
                allowed="None or a positive int",
            )
        sliding = require_int(
            self.n_sliding_layers, "TransformerShape.n_sliding_layers", SpmdTypeError, minimum=0, range_error=MfuError
        )
        if sliding > self.n_layer or (sliding and self.sliding_window is None):
            raise MfuError(
                f"TransformerShape.n_sliding_layers = {sliding} needs a sliding_window and at most n_layer "
                f"({self.n_layer}) layers; got sliding_window={self.sliding_window}."
            )

    @classmethod
    def from_hf_config(cls, config: Any, n_params: int | None = None) -> TransformerShape:
        """From a Hugging Face GPT-2, Llama-family or Gemma config (``n_params`` counted if not
        given); a Gemma 2 or 3 config's local layers and Mistral's ``sliding_window`` give the
        sliding-window fields.

        Raises:
            MfuError: a config of another model type, or one whose sizes are not positive ints
                (or whose width does not split into its heads).
        """
        model_type = getattr(config, "model_type", "")
        if n_params is not None:
            require_int(
                n_params, "TransformerShape.from_hf_config: n_params", SpmdTypeError, minimum=1, range_error=MfuError
            )
        if model_type == "gpt2":
            d, L, H, V, T = _fields(config, "n_embd", "n_layer", "n_head", "vocab_size", "n_positions")
            F = _fields(config, "n_inner")[0] if getattr(config, "n_inner", None) is not None else 4 * d
            _divides(config, "n_embd", d, H)
            per_layer = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * F + F) + (F * d + d)
            total = V * d + T * d + L * per_layer + 2 * d
            if not getattr(config, "tie_word_embeddings", True):
                total += V * d
            embedding = T * d + (0 if getattr(config, "tie_word_embeddings", True) else V * d)
            return cls(L, d, H, d // H, F, V, H, False, n_params or total, embedding)
        if model_type in ("llama", "mistral", "qwen2", *_GEMMA_NORMS):
            d, L, H, V, F = _fields(
                config, "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"
            )
            Hkv = _fields(config, "num_key_value_heads")[0] if getattr(config, "num_key_value_heads", None) else H
            if getattr(config, "head_dim", None):
                Q = _fields(config, "head_dim")[0]
            else:
                Q = _divides(config, "hidden_size", d, H)
            extra_norms, q_k_norms = _GEMMA_NORMS.get(model_type, (0, 0))
            per_layer = d * H * Q + 2 * d * Hkv * Q + H * Q * d + 3 * d * F + (2 + extra_norms) * d + q_k_norms * Q
            tied = getattr(config, "tie_word_embeddings", False)
            total = V * d * (1 if tied else 2) + L * per_layer + d
            embedding = 0 if tied else V * d
            return cls(L, d, H, Q, F, V, Hkv, True, n_params or total, embedding, *sliding_layers(config, L))
        known = ", ".join(("gpt2", "llama", "mistral", "qwen2", *_GEMMA_NORMS))
        raise MfuError(f"No FLOP model for model_type {model_type!r}; known: {known}.")


# Gemma's decoder layers: the norms beyond Llama's two (Gemma 2 and 3 norm each sublayer's input
# and output), and Gemma 3's norms of the query and key heads.
_GEMMA_NORMS = {"gemma": (0, 0), "gemma2": (2, 0), "gemma3_text": (2, 2)}


def sliding_layers(config: Any, n_layer: int) -> tuple[int | None, int]:
    """``(sliding_window, n_sliding_layers)`` of a Hugging Face config: its ``layer_types``
    (``"sliding_attention"`` layers), or Mistral's every layer (its config has a window and no
    layer types); a window with neither says nothing of the layers. The one reading of a config's
    windows (the planner's context check reads it too).

    Raises:
        MfuError: the window is not a positive int.
    """
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    if window is None or (kinds is None and getattr(config, "model_type", "") != "mistral"):
        return None, 0
    window = _fields(config, "sliding_window")[0]
    sliding = n_layer if kinds is None else sum(kind == "sliding_attention" for kind in kinds[:n_layer])
    return (window, sliding) if sliding else (None, 0)


def _fields(config: Any, *names: str) -> tuple[int, ...]:
    """The config's ``names``, each a positive int, or an MfuError naming the field."""
    values = tuple(getattr(config, name, None) for name in names)
    for name, value in zip(names, values):
        require_int(value, f"{type(config).__name__}.{name}", MfuError, minimum=1, allowed="a positive int")
    return values


def _divides(config: Any, name: str, width: int, heads: int) -> int:
    """``width // heads``, or an MfuError when the heads do not split ``name``."""
    if width % heads:
        raise MfuError(f"{type(config).__name__}.{name} = {width} does not split into {heads} heads; give a multiple.")
    return width // heads


def _check_step(shape: object, seq_len: object) -> None:
    if not isinstance(shape, TransformerShape):
        raise SpmdTypeError(f"shape must be a TransformerShape, got {type(shape).__name__}.")
    require_int(seq_len, "seq_len", SpmdTypeError, minimum=1, range_error=MfuError)


def six_n_flops_per_token(n_params: float) -> float:
    """The blogs' training FLOPs per token: ``6 N`` (N all parameters, a finite number >= 0)."""
    return 6.0 * require_real(
        n_params, "six_n_flops_per_token: n_params", SpmdTypeError, minimum=0, range_error=MfuError
    )


def palm_flops_per_token(shape: TransformerShape, seq_len: int) -> float:
    """PaLM's training FLOPs per token: ``6 N + 12 L H Q T``, N without non-matmul embeddings."""
    _check_step(shape, seq_len)
    n = shape.n_params - shape.n_embedding_params
    return 6.0 * n + 12.0 * shape.n_layer * shape.n_head * shape.head_dim * seq_len


def forward_matmul_flops_per_token(shape: TransformerShape, seq_len: int, causal: bool = True) -> dict[str, float]:
    """Forward FLOPs per token of every matmul, by part: the blocks' (``qkv``, ``attention``,
    ``out``, ``mlp_in``, ``mlp_out``, each over every layer) and the ``unembedding``."""
    _check_step(shape, seq_len)
    if not isinstance(causal, bool):
        raise SpmdTypeError(f"causal takes a bool, got {causal!r:.60}.")
    D, H, Q, Hkv, F, V, T = (
        shape.d_model,
        shape.n_head,
        shape.head_dim,
        shape.n_kv_head,
        shape.d_ff,
        shape.vocab,
        seq_len,
    )
    block = {
        "qkv": 2 * D * (H + 2 * Hkv) * Q,
        "out": 2 * H * Q * D,
        "mlp_in": 2 * D * F * (2 if shape.gated_mlp else 1),
        "mlp_out": 2 * D * F,
    }
    half = 0.5 if causal else 1.0
    sliding = shape.n_sliding_layers
    window = min(shape.sliding_window or T, T)
    # scores and values over T keys, or over a sliding layer's window
    attention = 4 * H * Q * half * ((shape.n_layer - sliding) * T + sliding * window)
    parts = {part: shape.n_layer * flops for part, flops in block.items()}
    return {"qkv": parts.pop("qkv"), "attention": attention, **parts, "unembedding": 2 * D * V}


def matmul_flops_per_token(shape: TransformerShape, seq_len: int, causal: bool = True) -> float:
    """Training FLOPs per token from every matmul (module docstring); backward = 2 x forward."""
    return 3.0 * sum(forward_matmul_flops_per_token(shape, seq_len, causal).values())
