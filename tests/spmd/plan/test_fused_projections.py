"""Fused projections (`spmd.plan.request.fused_projections`): a Llama's q/k/v and MLP input
projections fused compute what the separate ones do (numerics, on JAX's CPU), and the compiled
2-D step does the same FLOPs in fewer matmuls; a grouped-query model's q/k/v, and a model with
nothing to fuse, are refused before anything compiles. The compiles and the numerics run in a
process of their own (libtpu and torchax stay out of the test session)."""

import pytest

from spmd.plan import PlanError
from spmd.plan.__main__ import main as cli
from spmd.plan.request.fused_projections import FUSIBLE, fusion_groups, parse_fused
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings
from tests.spmd.plan.child_compile import python_code

# Multi-head (as many key/value heads as query heads), with biases on q, k and v as Qwen2's.
LLAMA = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 1024,
    "tie_word_embeddings": False, "attention_bias": True,
}  # fmt: skip

NUMERICS = r"""
import json, sys
import numpy as np, torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
from spmd.plan._jax_compat import import_torchax
from spmd.plan.request.fused_projections import fused_projections, fusion_groups

torch.manual_seed(0)
config = LlamaConfig(**json.load(open(sys.argv[1])))
layer = LlamaDecoderLayer(config, 0).eval()
x = torch.randn(2, 8, config.hidden_size)
positions = LlamaRotaryEmbedding(config)(x, torch.arange(8)[None])
want = layer(x, position_embeddings=positions)
env = import_torchax().tensor.Environment()
with env:
    params = {n: env.to_xla(p.detach()) for n, p in layer.named_parameters()}
    jx, jpositions = env.to_xla(x), env.to_xla(positions)
    groups = fusion_groups(layer, ("qkv", "mlp"))
    with fused_projections(groups, env):
        replaced = ["forward" in m.__dict__ for g in groups for m in g.members]
        got = torch.func.functional_call(layer, params, (jx,), {"position_embeddings": jpositions})
    restored = all("forward" not in m.__dict__ for g in groups for m in g.members)
got, want = (v[0] if isinstance(v, tuple) else v for v in (got, want))
error = float(np.abs(np.asarray(env.t2j_iso(got)) - want.detach().numpy()).max())
print(json.dumps({"groups": [g.kind for g in groups], "replaced": all(replaced), "restored": restored, "error": error}))
"""

COMPILE = r"""
import json, re, sys
from spmd.plan.api import plan_program
from spmd.plan.request.settings import PlanSettings

out = {}
for fused in ("", "qkv,mlp"):
    settings = PlanSettings("v5e:2x2", 1, 256, "bfloat16", "dot", fused=fused)
    report, hlo = plan_program(sys.argv[1], settings, strategy="2d", mesh={"fsdp": 2, "tensor": 2}, global_batch=8,
                               remat="full")
    out[fused or "none"] = {
        "flops": report.xla_flops, "fits": report.fits, "fused": list(report.fused),
        "matmuls": len(re.findall(r"= \S+ (?:dot|convolution)\(", hlo)), "heading": report.table().splitlines()[0],
    }
print(json.dumps(out))
"""

FUSED_NUMERICS = python_code(NUMERICS, LLAMA, timeout=600)
FUSED_COMPILES = python_code(COMPILE, LLAMA, timeout=1200)


def test_fused_projections_compute_what_the_separate_ones_do():
    result = FUSED_NUMERICS.result()
    assert result["groups"] == ["qkv", "mlp"]
    assert result["replaced"] and result["restored"]
    assert result["error"] < 1e-5, result


def test_the_fused_step_does_the_same_flops_in_fewer_matmuls():
    result = FUSED_COMPILES.result()
    separate, fused = result["none"], result["qkv,mlp"]
    assert separate["fits"] and fused["fits"]
    assert fused["flops"] == pytest.approx(separate["flops"], rel=0.005)
    # per layer 5 projection matmuls become 2 in the forward, and as many fewer again in the
    # recomputed forward and the input gradient
    assert fused["matmuls"] < separate["matmuls"], result
    assert fused["fused"] == ["qkv", "mlp"] and "fused qkv and mlp projections" in fused["heading"]
    assert not separate["fused"] and "fused" not in separate["heading"]


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("", ()),
        (None, ()),
        ("mlp", ("mlp",)),
        ("mlp,qkv", ("qkv", "mlp")),
        (["qkv"], ("qkv",)),
        (" qkv , mlp", ("qkv", "mlp")),
    ],
)
def test_fused_reads_maxtexts_two_fusions_in_one_order(value, parsed):
    assert parse_fused(value) == parsed
    assert PlanSettings("v5e:2x2", fused=value).fused == parsed


@pytest.mark.parametrize(
    ("value", "says"), [("qkvo", "unknown 'qkvo'"), ("qkv,qkv", "a repeated name"), (3, "unknown 3")]
)
def test_a_bad_fusion_is_refused_with_the_names_it_takes(value, says):
    with pytest.raises(PlanError, match=f"fused takes qkv and mlp .*{says}"):
        PlanSettings("v5e:2x2", fused=value)


def test_fused_is_in_the_compile_caches_key_only_when_given():
    assert "fused" not in PlanSettings("v5e:2x2").cache_key()
    assert PlanSettings("v5e:2x2", fused="mlp,qkv").cache_key()["fused"] == "qkv,mlp"


def test_a_llama_has_a_qkv_and_an_mlp_group_a_layer():
    module, _ = build_meta_model("maxtext-16b")
    groups = fusion_groups(module, ("qkv", "mlp"))
    layers = len(module.model.layers)
    assert [g.kind for g in groups] == ["qkv", "mlp"] * layers
    first = module.model.layers[0]
    assert groups[0].members == (first.self_attn.q_proj, first.self_attn.k_proj, first.self_attn.v_proj)
    assert groups[1].members == (first.mlp.gate_proj, first.mlp.up_proj)
    assert set(FUSIBLE) == {"qkv", "mlp"}


def test_grouped_query_attention_cannot_fuse_qkv_but_can_fuse_its_mlp():
    module, _ = build_meta_model("llama3-8b")  # 32 query heads, 8 key/value heads
    with pytest.raises(PlanError, match="query projection has 4096 outputs and its key/value projections 1024"):
        PlanSettings("v5e:2x2", fused="qkv").check_model(module)
    PlanSettings("v5e:2x2", fused="mlp").check_model(module)


def test_a_model_with_nothing_to_fuse_is_refused():
    module, _ = build_meta_model("gpt2")  # c_attn and c_fc: one projection each already
    for kind in ("qkv", "mlp"):
        with pytest.raises(PlanError, match=f"fused {kind}: GPT2LMHeadModel has no block with"):
            PlanSettings("v5e:2x2", fused=kind).check_model(module)


def test_plan_advise_and_the_cli_refuse_before_compiling(capsys):
    from spmd.plan.advisor.advisor import advise
    from spmd.plan.api import plan

    with pytest.raises(PlanError, match="grouped-query attention"):
        plan("llama3-8b", "v5e:2x2", fused="qkv")
    with pytest.raises(PlanError, match="grouped-query attention"):
        advise("llama3-8b", "v5e:2x2", fused="qkv", cache_dir=None)
    assert cli(["llama3-8b", "--topology", "v5e:2x2", "--fused", "qkv"]) == 2
    assert "error: fused qkv: LlamaForCausalLM's query projection" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        cli(["llama3-8b", "--topology", "v5e:2x2", "--fused", "qkv,out"])
    assert exit.value.code == 2 and "--fused: fused takes qkv and mlp" in capsys.readouterr().err


def test_the_v5e_128b_recipe_fuses_as_its_script_does():
    import importlib.util

    from spmd.plan.predict.published import PUBLISHED
    from tests.torchrun import ROOT

    spec = importlib.util.spec_from_file_location("plan_prediction", ROOT / "benchmarks" / "plan_prediction.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    runs = [p for p in PUBLISHED if p.model == "maxtext-128b" and p.chip == "TPU v5e"]
    assert len(runs) == 6  # one slice, and 2 to 32 slices
    assert {p.recipe.fused for p in runs} == {("qkv", "mlp")}
    assert {bench._settings(p).fused for p in runs} == {("qkv", "mlp")}  # what the benchmark compiles
    assert all(p.recipe.fused == () for p in PUBLISHED if p.model != "maxtext-128b" or p.chip != "TPU v5e")


def test_a_reports_fusions_survive_its_json():
    import dataclasses
    import json

    from spmd.plan.report.plan_report import PlanReport
    from tests.spmd.plan.test_flops_explained import report

    fused = dataclasses.replace(report(1.0), fused=("qkv", "mlp"))
    back = PlanReport.from_dict(json.loads(json.dumps(fused.to_dict())))
    assert back.fused == ("qkv", "mlp") and back == fused
    assert "; fused qkv and mlp projections" in back.table().splitlines()[0]
    assert PlanReport.from_dict(json.loads(json.dumps(report(1.0).to_dict()))).fused == ()
