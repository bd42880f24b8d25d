"""2-D sharding plans for Hugging Face GPT-2 and Llama: the sharding of every parameter, the
fallback to FSDP-only meshes, strictness, and numerics equal to one device."""

import copy

import numpy as np
import pytest
import torch

from fsdp_xla import FSDP
from fsdp_xla.hf import gpt2_plan, llama_plan
from mesh import Mesh
from spmd import P, get_sharding, mark_sharding
from spmd.logical_axes import LogicalAxisRules, ShardingPlan, UnmatchedParameterError
from spmd.sharding._named_sharding import hlo_sharding_for
from tests.fsdp_xla.hf.models import gpt2, llama, token_batches

MESH_2D = Mesh(np.arange(8), (4, 2), ("fsdp", "tensor"))
MESH_1D = Mesh(np.arange(8), (8,), ("fsdp",))

GPT2_2D = {
    "transformer.wte.weight": P("tensor", "fsdp"),
    "transformer.wpe.weight": P(None, "fsdp"),
    "transformer.h.0.ln_1.weight": P(),
    "transformer.h.0.ln_1.bias": P(),
    "transformer.h.0.attn.c_attn.weight": P("fsdp", "tensor"),  # Conv1D [in, out]: column parallel
    "transformer.h.0.attn.c_attn.bias": P("tensor"),
    "transformer.h.0.attn.c_proj.weight": P("tensor", "fsdp"),  # row parallel
    "transformer.h.0.attn.c_proj.bias": P(),
    "transformer.h.0.mlp.c_fc.weight": P("fsdp", "tensor"),
    "transformer.h.0.mlp.c_fc.bias": P("tensor"),
    "transformer.h.0.mlp.c_proj.weight": P("tensor", "fsdp"),
    "transformer.h.0.mlp.c_proj.bias": P(),
    "transformer.ln_f.weight": P(),
}

LLAMA_2D = {
    "model.embed_tokens.weight": P("tensor", "fsdp"),
    "model.layers.0.self_attn.q_proj.weight": P("tensor", "fsdp"),  # Linear [out, in]: column parallel
    "model.layers.0.self_attn.k_proj.weight": P("tensor", "fsdp"),
    "model.layers.0.self_attn.v_proj.weight": P("tensor", "fsdp"),
    "model.layers.0.self_attn.o_proj.weight": P("fsdp", "tensor"),  # row parallel
    "model.layers.0.mlp.gate_proj.weight": P("tensor", "fsdp"),
    "model.layers.0.mlp.up_proj.weight": P("tensor", "fsdp"),
    "model.layers.0.mlp.down_proj.weight": P("fsdp", "tensor"),
    "model.layers.0.input_layernorm.weight": P(),
    "model.layers.0.post_attention_layernorm.weight": P(),
    "model.norm.weight": P(),
    "lm_head.weight": P("tensor", "fsdp"),
}


@pytest.mark.parametrize("build, plan, expected", [(gpt2, gpt2_plan(), GPT2_2D), (llama, llama_plan(), LLAMA_2D)])
def test_every_parameter_gets_the_expected_2d_sharding(xla, build, plan, expected):
    model = build().to(xla)
    specs = plan.apply(model, MESH_2D)
    assert set(specs) == {n for n, _ in model.named_parameters()}
    params = dict(model.named_parameters())
    for name, spec in expected.items():
        assert specs[name] == spec, name
        p = params[name]
        assert get_sharding(p) == hlo_sharding_for(MESH_2D, spec, p.dim(), tuple(p.shape)), name


def test_the_same_plan_is_fsdp_on_a_1d_mesh():
    plan = gpt2_plan()
    assert plan.spec_for("transformer.h.3.attn.c_attn.weight", (64, 192), MESH_1D) == P("fsdp")
    assert plan.spec_for("transformer.h.3.attn.c_proj.weight", (64, 64), MESH_1D) == P("fsdp")
    assert plan.spec_for("transformer.wte.weight", (128, 64), MESH_1D) == P("fsdp")
    assert llama_plan().spec_for("model.layers.0.mlp.down_proj.weight", (64, 128), MESH_1D) == P("fsdp")


def test_with_context_parallelism_the_width_goes_to_fsdp_x_context():
    """FSDP shards over fsdp x context by default (mesh.ParallelDims.param_shard_axes), so the
    plan's FSDP entry is those axes together, or those of them the mesh has."""
    plan, q, o = llama_plan(), "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"
    mesh_3d = Mesh(np.arange(8), (2, 2, 2), ("fsdp", "context", "tensor"))
    assert plan.spec_for(q, (64, 64), mesh_3d) == P("tensor", ("fsdp", "context"))
    assert plan.spec_for(o, (64, 64), mesh_3d) == P(("fsdp", "context"), "tensor")
    no_fsdp_axis = Mesh(np.arange(4), (2, 2), ("context", "tensor"))  # fsdp 1 x context 2 x tensor 2
    assert plan.spec_for(q, (64, 64), no_fsdp_axis) == P("tensor", "context")
    no_tensor_axis = Mesh(np.arange(8), (4, 2), ("fsdp", "context"))  # heads fall back to FSDP's axes
    assert plan.spec_for(q, (64, 64), no_tensor_axis) == P(("fsdp", "context"))
    assert plan.spec_for("model.norm.weight", (64,), mesh_3d) == P()


def test_strict_plans_name_unmatched_parameters():
    plan = ShardingPlan(params=((r"weight$", ("embed", None)),), axes=LogicalAxisRules((("embed", "fsdp"),)))
    with pytest.raises(UnmatchedParameterError, match=r"no rule matches parameter 'layer.bias' of shape \(4,\)"):
        plan.spec_for("layer.bias", (4,), MESH_1D)
    loose = ShardingPlan(plan.params, plan.axes, strict=False)
    assert loose.spec_for("layer.bias", (4,), MESH_1D) == P()
    with pytest.raises(ValueError, match=r"gives 2 logical axes .* has shape \(4, 4, 4\)"):
        plan.spec_for("x.weight", (4, 4, 4), MESH_1D)


def sgd_losses(model, batches, xla=None, mesh=None, steps_lr=0.05):
    import torch_xla

    optimizer = torch.optim.SGD(model.parameters(), lr=steps_lr)
    losses = []
    for tokens in batches:
        if xla is not None:
            tokens = tokens.to(xla)
            mark_sharding(tokens, mesh, P("fsdp"))
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if xla is not None:
            torch_xla.sync()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("build, plan", [(gpt2, gpt2_plan()), (llama, llama_plan())])
def test_2d_plan_trains_like_one_device(xla, build, plan):
    ref = build()
    model = copy.deepcopy(ref).to(xla)
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # .to() unties GPT-2's embeddings
    plan.apply(model, MESH_2D)
    data = token_batches(3)
    torch.testing.assert_close(
        torch.tensor(sgd_losses(model, data, xla, MESH_2D)), torch.tensor(sgd_losses(ref, data)), rtol=1e-5, atol=1e-5
    )


def test_fsdp_with_the_plan_trains_like_one_device(xla):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from fsdp_xla import transformer_auto_wrap_policy

    ref = llama()
    model = FSDP(
        copy.deepcopy(ref),
        mesh=MESH_2D,
        auto_wrap_policy=transformer_auto_wrap_policy({LlamaDecoderLayer}),
        param_spec_fn=llama_plan().param_spec_fn(MESH_2D),
    )
    q = model.model.layers[0].self_attn.q_proj.weight
    assert get_sharding(q) == hlo_sharding_for(MESH_2D, P("tensor", "fsdp"), 2)
    data = token_batches(3)
    torch.testing.assert_close(
        torch.tensor(sgd_losses(model, data, xla, MESH_2D)), torch.tensor(sgd_losses(ref, data)), rtol=1e-5, atol=1e-5
    )
