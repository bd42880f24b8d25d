"""Sharding plans for Hugging Face GPT-2 and Llama: FSDP x tensor from parameter names.

The logical axes follow MaxText: ``embed`` (model width) goes to FSDP's axes, ``fsdp`` x
``context`` (`mesh.roles.param_shard_axes`, the axes FSDP shards over by default: with context
parallelism the weights are split over the context devices too, as torchtitan does), or those
of them the mesh has; ``heads``, ``mlp`` and ``vocab`` to the ``tensor`` axis, so attention and
MLP are Megatron-style: column-parallel in (q/k/v, up/gate, GPT-2's ``c_attn``/``c_fc``),
row-parallel out (``o_proj``/``down_proj``, ``c_proj``). When the mesh has no ``tensor`` axis
they fall back to FSDP's axes, so the same plan is plain FSDP on a mesh without one. Norms (and
biases added after a row-parallel matmul) stay replicated. This is the scheme behind
PyTorch/XLA's Llama 2 results (mesh (32, 4) on v4-256).

GPT-2's ``Conv1D`` stores weights as ``[in, out]`` (the transpose of ``nn.Linear``), which the
rules below account for.
"""

from __future__ import annotations

from itertools import combinations

from mesh import Role, roles
from spmd.logical_axes import LogicalAxisRules, ShardingPlan

__all__ = ["DEFAULT_AXIS_RULES", "gpt2_plan", "llama_plan"]

_SHARD = roles.param_shard_axes(tuple(Role))  # fsdp, context
# All of FSDP's axes together first, then fewer: a rule applies only where the mesh has every
# axis it names, and a mesh from ParallelDims leaves out the axes of degree 1 (fsdp 1 x context 2
# x tensor 2 has no fsdp axis). FSDP stores a parameter over the axes it shards over, so the
# plan's FSDP entry must be those axes, as one entry in mesh order (`fsdp_xla._sharding`).
_FSDP_GROUPS = tuple(
    group if len(group) > 1 else group[0] for n in range(len(_SHARD), 0, -1) for group in combinations(_SHARD, n)
)

DEFAULT_AXIS_RULES = LogicalAxisRules(
    (
        ("vocab", Role.TENSOR.value),
        ("heads", Role.TENSOR.value),
        ("mlp", Role.TENSOR.value),
        *(("embed", group) for group in _FSDP_GROUPS),
        *((logical, group) for logical in ("vocab", "heads", "mlp") for group in _FSDP_GROUPS),
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
