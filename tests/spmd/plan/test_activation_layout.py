"""The activation layout (`spmd.logical_axes.ACTIVATION_AXIS_RULES`, MaxText's ``activation_*``
logical-axis rules): the residual stream between blocks of a 2-D plan is split over ``tensor``.
The compile runs in a process of its own (libtpu and torchax stay out of the test session)."""

import json

import pytest

from mesh import Mesh
from spmd.logical_axes import ACTIVATION_AXIS_RULES, RESIDUAL
from spmd.sharding._partition_spec import P
from tests.spmd.plan.child_compile import on_demand_on_torch_xla, python_code

# 3 layers (no other dim is 3) of width 256 (no other dim but the K/V heads' 2 x 128 is 256).
LLAMA = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 3,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # fmt: skip

COMPILE = """
import json, re, sys
from spmd.plan.api import _lower, _request
from spmd.plan.compile.step import compile_step
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings

settings = PlanSettings("v5e:2x2", 1, 512, "bfloat16", "dot")
module, hf_config = build_meta_model(sys.argv[1])
req = _request(settings, "2d", {"fsdp": 2, "tensor": 2}, 8, "full", 2)
lowered, _, _ = _lower(req, module, hf_config, 512, None)
hlo = compile_step(lowered.lowered).hlo_text
print(json.dumps(sorted(set(re.findall(r"bf16\\[3,[\\d,]+\\]", hlo)))))
"""
STACKED = python_code(COMPILE, LLAMA, timeout=1200)


@pytest.mark.reads(STACKED)
@on_demand_on_torch_xla
def test_a_2d_plan_s_residual_stream_between_blocks_is_split_over_tensor():
    """Under remat `full` the block scan keeps each layer's input, stacked over the 3 layers: per
    device 4 sequences (8 over fsdp=2) x 512 tokens x the width over tensor=2, 128 of 256."""
    stacked = STACKED.result()
    assert "bf16[3,4,512,128]" in stacked, stacked
    assert "bf16[3,4,512,256]" not in stacked, stacked  # the whole width on each tensor shard: Megatron's layout


@pytest.mark.parametrize(
    ("axes", "spec"),
    [
        ({"fsdp": 2, "tensor": 2}, P("fsdp", None, "tensor")),
        ({"data": 2, "fsdp": 2, "tensor": 2}, P(("data", "fsdp"), None, "tensor")),
        ({"fsdp": 2, "context": 2, "tensor": 2}, P("fsdp", "context", "tensor")),
        ({"data": 2, "fsdp": 2, "context": 2}, P(("data", "fsdp"), "context")),
        ({"fsdp": 4}, P("fsdp")),
        ({"data": 4}, P("data")),
    ],
)
def test_the_residual_s_logical_axes_map_as_maxtext_s_rules(axes, spec):
    mesh = Mesh(range(2 ** len(axes) if len(axes) > 1 else 4), tuple(axes.values()), tuple(axes))
    assert ACTIVATION_AXIS_RULES.spec(RESIDUAL, mesh) == spec


def test_every_activation_axis_has_a_rule():
    mesh = Mesh(range(4), (2, 2), ("fsdp", "tensor"))
    spec = ACTIVATION_AXIS_RULES.spec(("activation_batch", "activation_heads", "activation_length"), mesh)
    assert spec == P("fsdp", "tensor")
    for logical in ("activation_embed", "activation_mlp", "activation_vocab"):
        assert ACTIVATION_AXIS_RULES.spec(("activation_batch", logical), mesh) == P("fsdp", "tensor")


def test_the_memory_math_counts_the_layer_input_split_over_tensor(tmp_path):
    """What the compile above keeps a token under `full` (the layer input, 128 of 256 wide in bf16),
    as our memory math counts it; `offload` moves the same bytes to the host."""
    from spmd.plan.predict.memory import model_shape, saved_per_token
    from spmd.plan.request.attention import Attention
    from spmd.plan.request.models import build_meta_model
    from spmd.plan.request.remat import Remat

    config = tmp_path / "llama.json"
    config.write_text(json.dumps(LLAMA))
    module, hf_config = build_meta_model(str(config))
    shape = model_shape(hf_config, sum(p.numel() for p in module.parameters()))
    assert saved_per_token(shape, Remat.FULL, Attention.DOT, 512, tensor=2) == (128 * 2, 0.0)
    assert saved_per_token(shape, Remat.OFFLOAD, Attention.DOT, 512, tensor=2) == (0.0, 128 * 2)
    assert saved_per_token(shape, Remat.FULL, Attention.DOT, 512, tensor=1) == (256 * 2, 0.0)


def test_the_memory_math_counts_the_out_projection_split_over_tensor(tmp_path):
    """MaxText's 64B on v5p-128 (width 8192 over tensor=4) keeps its input, q, k, v and out
    projection stacks at 2048 wide a device (libtpu's largest buffers: 5 x bf16[64,12,2048,2048]):
    the out projection's output is split like the stream it is added to."""
    from spmd.plan.predict.memory import model_shape, saved_per_token
    from spmd.plan.request.attention import Attention
    from spmd.plan.request.models import build_meta_model
    from spmd.plan.request.remat import Remat

    module, hf_config = build_meta_model("maxtext-64b")
    shape = model_shape(hf_config, sum(p.numel() for p in module.parameters()))
    device, _ = saved_per_token(shape, Remat.DOTS, Attention.FLASH, 2048, tensor=4)
    assert device == (5 * 2048 + 2 * 28672 / 4) * 2  # input, q, k, v, out; the MLP's two inputs
