"""Remat policies and flash attention, compiled for TPU v5e:2x2 by plan_worker.py: what each keeps
in HBM, and that flash attention is the splash kernel, holding no seq x seq scores."""

import pytest

from spmd.plan import PlanReport
from tests.spmd.plan import plan_results

MIB = 2**20
# plan_worker's step: 64 sequences of 512 tokens on 4 chips (16 each), 4 heads of 128, 2 layers.
SCORES_PER_LAYER = 16 * 4 * 512 * 512 * 2  # one layer's bf16 scores per chip: 16 MiB


@pytest.fixture(scope="module")
def reports():
    results, _ = plan_results.results()
    out = {k[len("remat_") :]: PlanReport.from_dict(v) for k, v in results.items() if k.startswith("remat_")}
    out["flash"] = PlanReport.from_dict(results["flash"])
    return out


def test_each_policy_keeps_less_than_the_one_before(reports):
    temp = {name: r.memory.temp_bytes for name, r in reports.items()}
    # none keeps every activation, the scores included (torch autograd's, no checkpointing)...
    assert temp["none"] > 2 * SCORES_PER_LAYER
    # ...dots only the projections' and MLP's outputs, offload not even each layer's input.
    assert temp["none"] > temp["dots"] > temp["offload"]
    assert {k: r.remat for k, r in reports.items()} == {
        "none": "none",
        "dots": "dots",
        "offload": "offload",
        "flash": "dots",
    }
    # Arguments are the same state whatever is kept.
    assert len({r.memory.argument_bytes for r in reports.values()}) == 1


def test_offload_moves_layer_inputs_to_the_host(reports):
    offload = reports["offload"].memory
    # Each of the 2 layers' bf16 input, [16, 512, 512] per chip, sits in host memory.
    assert offload.host_temp_bytes >= 2 * 16 * 512 * 512 * 2
    assert all(reports[k].memory.host_temp_bytes == 0 for k in ("none", "dots", "flash"))
    assert offload.temp_bytes < reports["dots"].memory.temp_bytes


def test_recomputation_is_in_the_estimate(reports):
    factors = {k: r.estimate.recompute_factor for k, r in reports.items()}
    assert factors["none"] == 1.0 < factors["dots"] < factors["offload"] == 4 / 3
    assert reports["none"].estimate.compute_seconds < reports["offload"].estimate.compute_seconds


def test_flash_attention_is_the_splash_kernel(reports):
    flash, dot = reports["flash"], reports["dots"]
    assert (flash.attention, dot.attention) == ("flash", "dot")
    # Forward, and backward's dq and dkv kernels (dots recomputes the forward): the real kernel, compiled.
    assert flash.splash_kernels >= 3 and dot.splash_kernels == 0
    # No [batch, heads, seq, seq] scores among the largest buffers (with `none`, dot attention
    # keeps them), and less HBM than dot attention under the same policy.
    scores = "16,4,512,512]"
    assert any(scores in line for line in reports["none"].memory.largest_allocations)
    assert not any(scores in line for line in flash.memory.largest_allocations)
    assert flash.memory.temp_bytes < dot.memory.temp_bytes
    assert f"attention flash ({flash.splash_kernels} splash kernels)" in flash.table()


def test_each_plan_predicts_a_step_between_its_bound_and_a_sane_limit(reports):
    """The prediction (the compiled program's model, `spmd.plan._step_time`) on the small Llama:
    no faster than the roofline with all communication hidden (model FLOPs at peak), no slower
    than 20 times the roofline with none hidden (tiny matmuls waste most of a 128 x 128 unit, and
    a ring step's latency outweighs 2-layer shards: slow, not unbounded); its MFU is the model's
    FLOPs at that time; and the program runs at least the model's FLOPs (more: recomputation)."""
    for name, r in reports.items():
        e = r.estimate
        assert e.predicted, name
        assert e.step_seconds_overlapped <= e.predicted_seconds <= 20 * e.step_seconds_serial, name
        assert e.predicted_mfu == pytest.approx(e.model_flops_per_step / (e.predicted_seconds * r.devices * 197e12))
        assert e.hardware_flops_per_device * r.devices >= 0.95 * e.model_flops_per_step, name
        assert r.step_seconds == e.predicted_seconds and r.mfu == e.predicted_mfu
        assert r.to_dict()["predicted_tflops_per_chip"] == pytest.approx(e.predicted_mfu * 197)
    # recomputation is in the program: offload (the whole forward again) runs more FLOPs than none
    flops = {k: r.estimate.hardware_flops_per_device for k, r in reports.items()}
    assert flops["offload"] > flops["none"]
    assert "predicted step (the compiled program" in reports["flash"].table()
    assert "MFU bound" in reports["flash"].table()
