"""The advice as the user reads it (spmd/plan/advisor/advice.py): what its heading and the
winner's code say of the settings the search planned with. Pure Python: a hand-made report."""

import dataclasses

from spmd.plan.advisor.advice import Advice, Candidate, Outcome
from tests.spmd.plan.test_flops_explained import TARGET, report


def _advice(weight_dtype: str, fused: tuple[str, ...] = ()) -> Advice:
    winner = Outcome(Candidate("fsdp", (("fsdp", 8),), 1), report(1.0))
    assert winner.fits
    return Advice(
        "m", TARGET.name, TARGET.chip.name, TARGET.chips, 1, 1024, "bfloat16", "dot", 2**30, (winner,),
        weight_dtype=weight_dtype, fused=fused,
    )  # fmt: skip


def test_bf16_weights_are_in_the_heading_the_json_and_the_winners_code():
    bf16, fp32 = _advice("bfloat16"), _advice("float32")
    assert "bfloat16 (bfloat16 weights), attention dot" in bf16.table()
    assert "weights)" not in fp32.table()
    assert bf16.to_dict()["weight_dtype"] == "bfloat16"
    # the plan's memory holds bf16 parameters and AdamW state: the code stores them so, before FSDP wraps
    cast = "model = model.to(torch.bfloat16)"
    code = bf16.code()
    assert cast in code and code.index(cast) < code.index("model = FSDP(")
    assert cast not in fp32.code()
    assert dataclasses.replace(bf16, weight_dtype="float32").code() == fp32.code()


def test_fused_projections_are_in_the_heading_the_json_and_the_winners_code():
    fused, separate = _advice("float32", ("qkv", "mlp")), _advice("float32")
    assert "attention dot, fused qkv and mlp projections; budget" in fused.table()
    assert "fused" not in separate.table()
    assert fused.to_dict()["fused"] == ("qkv", "mlp") and separate.to_dict()["fused"] == ()
    # the planned program fuses what the user's model runs apart: the code says so
    assert "# the plan ran the qkv and mlp projections as one matmul each (--fused)" in fused.code()
    assert "--fused" not in separate.code()
