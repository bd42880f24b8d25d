"""A context-parallel plan compiled for tpu7x:2x2x1 by plan_worker.py (fsdp=2 x context=4; the
FIDELITY Llama: 3 layers, width 256, 2 query heads and 1 K/V head of 128, 4 sequences of 512
tokens): K and V all-gathered over the context group in every layer with the formula's bytes, no
seq x seq buffer, the report's context section, and the advisor's cp search."""

import pytest

from mesh import Role
from spmd.plan import PlanReport
from spmd.plan.request.context import axes_spanned
from tests.spmd.plan import plan_results

LAYERS, KV_HEADS, HEAD_DIM, SEQ, CONTEXT = 3, 1, 128, 512, 4
BATCH_PER_SHARD = 2  # 4 sequences over fsdp=2
KV_BYTES = BATCH_PER_SHARD * KV_HEADS * SEQ * HEAD_DIM * 2  # one layer's bf16 K (or V), gathered
MESH = ((2, 4), ("fsdp", "context"))


@pytest.fixture(scope="module")
def found():
    results, _ = plan_results.results()
    run = results["context"]
    if "error" in run:
        pytest.skip(f"this lane's libtpu compiles no tpu7x: {run['error'][1][:120]}")
    return run


def _over_context(collectives):
    return [c for c in collectives if axes_spanned(tuple(c["group"]), *MESH) == (Role.CONTEXT.value,)]


def test_each_layer_all_gathers_k_and_v_over_the_context_group(found):
    over = _over_context(found["collectives"])
    gathers = [c for c in over if c["kind"] == "all-gather"]
    # K and V of every layer, each 2 x 1 x 512 x 128 x 2 bytes gathered from 128 tokens a shard: in
    # forward, and again in backward (the policy keeps the projections, not the gathered K and V)
    assert {c["result_bytes"] for c in gathers} == {KV_BYTES}
    assert sum(c["count"] for c in gathers) == 4 * LAYERS
    assert all("scaled_dot_product_attention" in c["op_name"] for c in gathers)
    # their gradients reduce-scattered back to the shards: each a context shard's quarter
    scatters = [c for c in over if c["kind"] == "reduce-scatter"]
    assert {c["result_bytes"] for c in scatters} == {KV_BYTES // CONTEXT}
    assert sum(c["count"] for c in scatters) == 2 * LAYERS
    # nothing else crosses the context group alone: the loss reduces each shard's tokens where they are
    assert len(over) == len(gathers) + len(scatters)


def test_the_plan_holds_no_seq_by_seq_buffer_and_fits(found):
    assert found["square"] == []
    report = PlanReport.from_dict(found["report"])
    assert report.fits and report.mesh == {"fsdp": 2, "context": 4} and report.splash_kernels > 0
    # the token batch splits over fsdp and context: a device holds 2 x 128 int32 tokens
    assert report.memory.argument_bytes == pytest.approx(report.memory.predicted_argument_bytes, rel=0.03)


def test_the_report_names_the_context_axis_its_gathers_and_collectives(found):
    report = PlanReport.from_dict(found["report"])
    c = report.context_parallel
    assert (c.axis, c.size, c.tokens_per_shard, c.kv_bytes_per_layer, c.layers) == ("context", 4, 128, KV_BYTES, 3)
    kinds = {k.kind: k.count for k in c.collectives}
    assert kinds == {"all-gather": 4 * LAYERS, "reduce-scatter": 2 * LAYERS}
    table = found["table"]
    assert "context parallelism: context=4, 128 of 512 tokens a shard" in table
    assert "K and V of each of 3 layers all-gathered over context: 0.2 MiB each a device" in table
    assert PlanReport.from_dict(report.to_dict()) == report  # the JSON round trip keeps the section


def test_the_advisor_searches_the_context_mesh(found):
    advice = found["advice"]
    (outcome,) = advice["outcomes"]
    assert (outcome["strategy"], outcome["mesh"], outcome["cached"]) == ("cp", {"fsdp": 2, "context": 4}, True)
    assert outcome["report"]["context_parallel"]["size"] == 4
    assert advice["winner"].startswith("cp fsdp=2 × context=4")
    assert advice["fsdp_config"] is None  # the Trainer runs no context parallelism
    assert "mark_sharding(input_ids, mesh, P('fsdp', 'context'))" in found["code"]
    assert "context parallelism: each sequence split over context=4" in found["code"]
