"""Sharding plans for Hugging Face GPT-2 and Llama: fsdp x tensor (2-D) from parameter names.

The logical axes follow MaxText: ``embed`` (model width) goes to the ``fsdp`` axis; ``heads``,
``mlp`` and ``vocab`` to the ``tensor`` axis, so attention and MLP are Megatron-style:
column-parallel in (q/k/v, up/gate, GPT-2's ``c_attn``/``c_fc``), row-parallel out
(``o_proj``/``down_proj``, ``c_proj``). When the mesh has no ``tensor`` axis they fall back to
``fsdp``, so the same plan is plain FSDP on a 1-D mesh. Norms (and biases added after a
row-parallel matmul) stay replicated. This is the scheme behind PyTorch/XLA's Llama 2
results (mesh (32, 4) on v4-256).

GPT-2's ``Conv1D`` stores weights as ``[in, out]`` (the transpose of ``nn.Linear``), which the
rules below account for.
"""

from __future__ import annotations

from mesh import Role
from spmd.logical_axes import LogicalAxisRules, ShardingPlan

__all__ = ["DEFAULT_AXIS_RULES", "gpt2_plan", "llama_plan"]

DEFAULT_AXIS_RULES = LogicalAxisRules(
    (
        ("vocab", Role.TENSOR.value),
        ("heads", Role.TENSOR.value),
        ("mlp", Role.TENSOR.value),
        ("embed", Role.FSDP.value),
        ("vocab", Role.FSDP.value),
        ("heads", Role.FSDP.value),
        ("mlp", Role.FSDP.value),
        ("norm", None),
    )
)


def gpt2_plan(axes: LogicalAxisRules = DEFAULT_AXIS_RULES, strict: bool = True) -> ShardingPlan:
    """The plan for ``GPT2Model`` / ``GPT2LMHeadModel`` parameters."""
    return ShardingPlan(
        params=(
            (r"wte\.weight$", ("vocab", "embed")),
            (r"wpe\.weight$", ("norm", "embed")),
            (r"attn\.c_attn\.weight$", ("embed", "heads")),
            (r"attn\.c_attn\.bias$", ("heads",)),
            (r"attn\.c_proj\.weight$", ("heads", "embed")),
            (r"mlp\.c_fc\.weight$", ("embed", "mlp")),
            (r"mlp\.c_fc\.bias$", ("mlp",)),
            (r"mlp\.c_proj\.weight$", ("mlp", "embed")),
            (r"c_proj\.bias$", ("norm",)),
            (r"ln_(1|2|f)\.(weight|bias)$", ("norm",)),
            (r"lm_head\.weight$", ("vocab", "embed")),
        ),
        axes=axes,
        strict=strict,
        name="gpt2_plan",
    )


def llama_plan(axes: LogicalAxisRules = DEFAULT_AXIS_RULES, strict: bool = True) -> ShardingPlan:
    """The plan for ``LlamaModel`` / ``LlamaForCausalLM`` parameters (Mistral and Qwen2 share the names)."""
    return ShardingPlan(
        params=(
            (r"embed_tokens\.weight$", ("vocab", "embed")),
            (r"self_attn\.(q|k|v)_proj\.weight$", ("heads", "embed")),
            (r"self_attn\.(q|k|v)_proj\.bias$", ("heads",)),
            (r"self_attn\.o_proj\.weight$", ("embed", "heads")),
            (r"self_attn\.o_proj\.bias$", ("norm",)),
            (r"mlp\.(gate|up)_proj\.weight$", ("mlp", "embed")),
            (r"mlp\.down_proj\.weight$", ("embed", "mlp")),
            (r"(input_layernorm|post_attention_layernorm|norm)\.weight$", ("norm",)),
            (r"lm_head\.weight$", ("vocab", "embed")),
        ),
        axes=axes,
        strict=strict,
        name="llama_plan",
    )
