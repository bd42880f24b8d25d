"""Remat policies and flash attention, compiled for TPU v5e:2x2 by plan_worker.py: what each keeps
in HBM, and that flash attention is the splash kernel, holding no seq x seq scores."""

import math

import pytest

from spmd.plan import PlanReport
from tests.spmd.plan import plan_results
from tests.spmd.plan.child_compile import on_demand_on_torch_xla

MIB = 2**20
# plan_worker's step (POLICY_BATCH): 32 sequences of 512 tokens on 4 chips (8 each), 4 heads of 128, 2 layers.
PER_CHIP = 8
SCORES_PER_LAYER = PER_CHIP * 4 * 512 * 512 * 2  # one layer's bf16 scores per chip: 8 MiB


@pytest.fixture(scope="module")
def reports():
    results, _ = plan_results.results()
    out = {k[len("remat_") :]: PlanReport.from_dict(v) for k, v in results.items() if k.startswith("remat_")}
    out["flash"] = PlanReport.from_dict(results["flash"])
    return out


@on_demand_on_torch_xla
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


@on_demand_on_torch_xla
def test_offload_moves_layer_inputs_to_the_host(reports):
    offload = reports["offload"].memory
    # Each of the 2 layers' bf16 input, [8, 512, 512] per chip, sits in host memory.
    assert offload.host_temp_bytes >= 2 * PER_CHIP * 512 * 512 * 2
    assert all(reports[k].memory.host_temp_bytes == 0 for k in ("none", "dots", "flash"))
    assert offload.temp_bytes < reports["dots"].memory.temp_bytes


@on_demand_on_torch_xla
def test_recomputation_is_in_the_estimate(reports):
    factors = {k: r.estimate.recompute_factor for k, r in reports.items()}
    assert factors["none"] == 1.0 < factors["dots"] < factors["offload"] == 4 / 3
    assert reports["none"].estimate.compute_seconds < reports["offload"].estimate.compute_seconds


@on_demand_on_torch_xla
def test_flash_attention_is_the_splash_kernel(reports):
    flash, dot = reports["flash"], reports["dots"]
    assert (flash.attention, dot.attention) == ("flash", "dot")
    # Forward, and backward's dq and dkv kernels (dots recomputes the forward): the real kernel, compiled.
    assert flash.splash_kernels >= 3 and dot.splash_kernels == 0
    # No [batch, heads, seq, seq] scores among the largest buffers (with `none`, dot attention
    # keeps them), and less HBM than dot attention under the same policy.
    scores = f"{PER_CHIP},4,512,512]"
    assert any(scores in line for line in reports["none"].memory.largest_allocations)
    assert not any(scores in line for line in flash.memory.largest_allocations)
    assert flash.memory.temp_bytes < dot.memory.temp_bytes
    assert f"attention flash ({flash.splash_kernels} splash kernels)" in flash.table()


# plan_worker's FIDELITY Llama on tpu7x:2x2x1: 16 sequences of 384 tokens, width 256, MLP 640,
# 2 query heads and 1 key/value head of 128, 3 layers; no dim but the sequence's is 384.
B, S, H, MLP, Q, KV = 16, 384, 256, 640, 256, 128


@pytest.fixture(scope="module")
def fidelity():
    results, _ = plan_results.results()
    found = results["fidelity"]
    if "error" in found:
        pytest.skip(f"this lane's libtpu compiles no tpu7x: {found['error'][1][:120]}")
    return found


def test_a_flash_step_holds_no_seq_by_seq_buffer(fidelity):
    # Anywhere in the optimized program (every instruction's shape): flash attention with remat
    # full, the recipe, has none; dot attention does (its scores), so the check can fail.
    assert fidelity["flash_full"]["square"] == []
    assert any(s.endswith(f",{S},{S}]") for s in fidelity["dot_dots"]["square"])


def _activation(width, on_host=False):
    return [[B, S, width], "bfloat16", on_host]


def test_each_remat_policy_saves_what_its_maxtext_name_says(fidelity):
    block_input = _activation(H)
    qkv = [block_input, _activation(Q), _activation(KV), _activation(KV)]  # query_proj, key_proj, value_proj
    except_mlp = [*qkv, _activation(H)]  # + out_proj
    # + mlpwi_0, mlpwi_1; mlpwo is named too, but backward never reads it, so JAX (and MaxText) keep it not
    minimal = [*except_mlp, _activation(MLP), _activation(MLP)]
    # + the splash kernel's residuals, attention's output [batch, heads, seq, head dim] and its fp32
    # log-sum-exp (MaxText's `context`): backward runs no attention forward again
    context = [*qkv, [[B, 2, S, 128], "bfloat16", False], [[B, 2, S], "float32", False]]
    expected = {
        "full": [block_input],
        "offload": [_activation(H, on_host=True)],
        "save_qkv_proj": qkv,
        "save_qkv_context": context,
        "save_dot_except_mlp": except_mlp,
        "dots": minimal,
    }
    saved = fidelity["saved"]
    for policy, arrays in expected.items():
        assert sorted(saved[policy]) == sorted(arrays), policy
    # none keeps every activation: more than minimal's, fp32 norm statistics among them.
    assert len(saved["none"]) > len(saved["dots"]) and any(a[1] == "float32" for a in saved["none"])


def _bytes_per_token(arrays, on_host):
    size = {"bfloat16": 2, "float32": 4}
    return sum(math.prod(shape) * size[dtype] for shape, dtype, host in arrays if host == on_host) / (B * S)


def test_our_memory_math_counts_what_jax_saves(fidelity):
    for policy, arrays in fidelity["saved"].items():
        device, host = fidelity["math"][policy]
        assert (device, host) == (_bytes_per_token(arrays, False), _bytes_per_token(arrays, True)), policy


def test_a_bf16_first_moment_takes_2_bytes_a_parameter(fidelity):
    # fp32 parameters (4), bf16 first moment (2), fp32 second moment (4), over 8 devices; int32 tokens.
    arguments = fidelity["flash_full"]["memory"]["argument_size_in_bytes"]
    expected = 10 * fidelity["n_params"] / 8 + 4 * B * S / 8
    assert abs(arguments - expected) / expected < 0.01, (arguments, expected)


def test_bf16_weights_store_the_parameters_and_second_moment_in_2_bytes(fidelity):
    # MaxText's weight_dtype=bfloat16 with an fp32 mu_dtype: parameters (2), first moment (4),
    # second moment (2, as the parameters), over 8 devices; int32 tokens. fp32 weights take 12.
    arguments = fidelity["dot_dots"]["memory"]["argument_size_in_bytes"]
    expected = 8 * fidelity["n_params"] / 8 + 4 * B * S / 8
    assert abs(arguments - expected) / expected < 0.01, (arguments, expected)


@on_demand_on_torch_xla
def test_each_plan_predicts_a_step_between_its_bound_and_a_sane_limit(reports):
    """The prediction (the compiled program's model, `spmd.plan.predict._step_time`) on the small Llama:
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
