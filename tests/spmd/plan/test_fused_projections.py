"""Fused projections (`spmd.plan.request.fused_projections`): a Llama's q/k/v and MLP input
projections fused compute what the separate ones do (numerics, on JAX's CPU), and the compiled
2-D step does the same FLOPs in fewer matmuls; a grouped-query model's q/k/v, and a model with
nothing to fuse, are refused before anything compiles. The compiles and the numerics run in the
planner tests' worker (tests/workers/plan_worker.py: libtpu and torchax stay out of the test session)."""

import pytest

from spmd.plan import PlanError
from spmd.plan.__main__ import main as cli
from spmd.plan.request.fused_projections import FUSIBLE, fusion_groups, parse_fused
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings
from tests.spmd.plan import plan_results


def test_fused_projections_compute_what_the_separate_ones_do():
    result = plan_results.results()[0]["fused_numerics"]
    assert result["groups"] == ["qkv", "mlp"]
    assert result["replaced"] and result["restored"]
    assert result["error"] < 1e-5, result


def test_the_fused_step_does_the_same_flops_in_fewer_matmuls():
    result = plan_results.results()[0]
    separate, fused = result["fused_none"], result["fused_qkv,mlp"]
    assert separate["fits"] and fused["fits"]
    # the matmuls' FLOPs as the step-time model counts them, and XLA's count of every op, within 1 %
    # (libtpu 0.0.52: equal, and 0.13 %; the torch_xla lane's 0.0.20 runs 0.57 % more matmul work
    # fused, and XLA counts 0.52 % more)
    assert fused["matmul_flops"] == pytest.approx(separate["matmul_flops"], rel=0.01)
    assert fused["flops"] == pytest.approx(separate["flops"], rel=0.01)
    # each of the 2 layers' 5 projection matmuls become 2 in the forward (24 matmuls in all where
    # there were 36, 2026-12-01: the recomputed forward and the input gradient fuse too)
    assert separate["matmuls"] - fused["matmuls"] >= 2 * 3, result
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
