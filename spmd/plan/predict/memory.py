"""Our own memory math: what a plan holds per device, from the model's shape alone, before any
compile. The advisor rules plans out with it (`spmd.plan.advisor.advisor`); each report sets it beside
the compiler's figure.

Per device, in bytes (``t``: tokens per device, a batch shard's sequences over the ``context``
axis, ``T``: the ``tensor`` axis size):

- **arguments**: the parameters and AdamW's second moment (fp32, or bf16 with MaxText's
  ``weight_dtype``), the first moment (bf16 when asked: ``mu_dtype``) and the int32 tokens, each
  sharded as stored (`spmd.plan.request.specs`).
- **saved activations**: what the remat policy keeps, ``L x t x`` `saved_per_token`; the
  projections split over ``tensor``, and the block's input (the residual stream, whose width the
  activation rules split over ``tensor``: `spmd.logical_axes.RESIDUAL`), are divided by ``T``.
  This is JAX's own list of the scan's residuals (`spmd.plan.lower.residuals.saved_residuals`), counted
  from the shape: exact for every policy but ``none``, whose list depends on how the model writes
  its norms (counted for Llama's).
- **working set**: the bf16 copy of fp32 parameters the step computes with (none for bf16
  weights, which it computes with as stored), and the larger of two
  peaks: the loss (the head gathered, its logits in bf16, their fp32 upcast and fp32 gradient,
  ``t x V / T x 10`` bytes) and one block's backward (its parameters gathered twice, forward and
  backward, the bf16 gradients, the block's recomputed MLP; with a ``context`` axis, the layer's
  gathered K and V and their copies in position order, 4 x ``b x kv_heads / T x seq x head_dim x 2``
  for ``b`` sequences a batch shard, `spmd.plan.request.context`).

The working set is the part a compiler schedules: it is what the math gets least right, and the
advisor compiles every plan within `MARGIN` of the budget rather than trust it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spmd._util.memory import GIB
from spmd.plan.request.attention import Attention
from spmd.plan.request.custom_remat import OUT_PROJ, CustomRemat
from spmd.plan.request.remat import BLOCK_INPUT, CONTEXT, Remat

__all__ = ["MARGIN", "MemoryMath", "model_shape", "plan_memory", "saved_per_token"]

MARGIN = 0.15  # plans our math puts within 15 % over the budget are still compiled ("close to the line")


@dataclass(frozen=True)
class MemoryMath:
    """Per-device bytes of one plan by our math (module docstring)."""

    arguments: int
    saved: int
    working: int
    host: int = 0

    @property
    def total(self) -> int:
        return self.arguments + self.saved + self.working

    def describe(self) -> str:
        parts = (
            f"arguments {self.arguments / GIB:.2f} + saved {self.saved / GIB:.2f} + working {self.working / GIB:.2f}"
        )
        return f"{self.total / GIB:.2f} GiB/device ({parts})"


def model_shape(hf_config: Any, n_params: int) -> Any:
    """The model's `spmd.mfu.flops.TransformerShape`, or ``None`` (a model of no known shape:
    the advisor then compiles without ruling anything out)."""
    from spmd.mfu.flops import TransformerShape

    try:
        return TransformerShape.from_hf_config(hf_config, n_params)
    except (ValueError, TypeError, AttributeError):
        return None


def _projections(shape: Any, tensor: int) -> dict[str, float]:
    """Elements per token of each projection's output, as a device holds it (``context``: the
    attention output the splash kernel keeps under that name, `Remat.SAVE_QKV_CONTEXT`)."""
    q, kv = shape.n_head * shape.head_dim / tensor, shape.n_kv_head * shape.head_dim / tensor
    out = {OUT_PROJ: shape.d_model / tensor, CONTEXT: q}  # out: summed onto the stream, split like it
    if shape.gated_mlp:  # Llama's family: q, k, v apart; a gated MLP
        out.update(query_proj=q, key_proj=kv, value_proj=kv, mlpwi_0=shape.d_ff / tensor, mlpwi_1=shape.d_ff / tensor)
    else:  # GPT-2: one fused q/k/v projection (c_attn), a plain MLP
        out.update(qkv_proj=q + 2 * kv, mlpwi=shape.d_ff / tensor)
    return out  # ``mlpwo`` is left out: backward never reads it (it only joins the residual stream)


def saved_per_token(shape: Any, remat: Remat, attention: Attention, seq_len: int, tensor: int = 1,
                    itemsize: int = 2) -> tuple[float, float]:  # fmt: skip
    """``(device, host)`` bytes one block keeps for backward per token (module docstring)."""
    d = shape.d_model / tensor  # the block's input: the residual stream, its width over tensor (RESIDUAL)
    if remat is Remat.OFFLOAD:
        return 0.0, float(d * itemsize)
    if isinstance(remat, CustomRemat):  # each name where its choice puts it; the input on the device unless offloaded
        projections = _projections(shape, tensor)
        device = [n for n in remat.saved_names if n != CONTEXT or attention is Attention.FLASH]
        host = [n for n in remat.offloaded_names if n != CONTEXT or attention is Attention.FLASH]
        on_host = BLOCK_INPUT in host
        lse = 4 * shape.n_head / tensor  # the kernel's fp32 log-sum-exp beside `context`
        dev = (0 if on_host else d) + sum(projections.get(n, 0.0) for n in device)
        off = (d if on_host else 0) + sum(projections.get(n, 0.0) for n in host)
        return dev * itemsize + (lse if CONTEXT in device else 0.0), off * itemsize + (lse if CONTEXT in host else 0.0)
    if remat is Remat.NONE:
        return _everything_per_token(shape, attention, seq_len, tensor, itemsize), 0.0
    projections = _projections(shape, tensor)
    names = [n for n in remat.saved_names or () if n != CONTEXT or attention is Attention.FLASH]
    kept = d + sum(projections.get(n, 0.0) for n in names)  # the block's input, and its names
    # the kernel's other residual under `context`: its fp32 log-sum-exp, one a head
    lse = 4 * shape.n_head / tensor if CONTEXT in names else 0.0
    return kept * itemsize + lse, 0.0


def _everything_per_token(shape: Any, attention: Attention, seq_len: int, tensor: int, itemsize: int) -> float:
    """``none``: every activation of a Llama block, as JAX lists them for the planner's program:
    in bf16 the input, both norms' outputs, the out projection, v, k after rotation, q after
    rotation and the context, six MLP arrays (gate, up, the SiLU's parts and the product); in fp32
    each norm's upcast input and output and statistics, and the kernel's log-sum-exp. With dot
    attention, the scores and their fp32 softmax too."""
    d, heads = shape.d_model, shape.n_head / tensor
    q, kv = heads * shape.head_dim, shape.n_kv_head * shape.head_dim / tensor
    mlp = (6 if shape.gated_mlp else 3) * shape.d_ff / tensor
    bf16 = 4 * d + 2 * q + 2 * kv + mlp
    fp32 = 4 * d + 4 + heads
    if attention is Attention.DOT:
        bf16 += heads * seq_len
        fp32 += heads * seq_len
    return bf16 * itemsize + fp32 * 4


def plan_memory(
    shape: Any,
    remat: Remat,
    attention: Attention,
    seq_len: int,
    per_device_batch: int,
    tensor: int,
    arguments: int,
    param_bytes: int,
    context: int = 1,
    vocab_tiles: int = 1,
    weight_bytes: int = 4,
) -> MemoryMath:
    """Our math for one plan (module docstring). ``arguments``: the state and tokens per device
    (sharding math); ``param_bytes``: the stored parameters per device alone, ``weight_bytes``
    each (4 fp32, 2 bf16); ``context``: the context axis the sequence is split over;
    ``vocab_tiles``: chunks the loss takes the logits in (`spmd.plan.request.vocab_tiling`), each
    holding that share of them."""
    tokens = per_device_batch * seq_len / context
    device, host = saved_per_token(shape, remat, attention, seq_len, tensor)
    saved = int(shape.n_layer * tokens * device)
    head = shape.vocab * shape.d_model / tensor
    loss = (
        2 * head + tokens / vocab_tiles * shape.vocab / tensor * 10
    )  # the gathered head; logits bf16, fp32, fp32 gradient
    layer_params = (shape.n_params - shape.vocab * shape.d_model) / shape.n_layer / tensor
    mlp = tokens * shape.d_ff / tensor * 3 * 2  # a block's recomputed MLP: gate, up and their product
    gathered = 4 * per_device_batch * shape.n_kv_head / tensor * seq_len * shape.head_dim * 2 if context > 1 else 0
    local_params = param_bytes / weight_bytes
    bf16_copy = 2 * local_params if weight_bytes > 2 else 0
    block = 2 * 2 * layer_params + 2 * local_params + mlp + gathered  # + the bf16 gradients
    working = int(bf16_copy + max(loss, block))
    return MemoryMath(arguments, saved, working, int(shape.n_layer * tokens * host))
