"""The advice as the user reads it (spmd/plan/advisor/advice.py): what its heading and the
winner's code say of the settings the search planned with. Pure Python: a hand-made report."""

import dataclasses

from spmd.plan.advisor.advice import Advice, Candidate, Outcome
from tests.spmd.plan.test_flops_explained import TARGET, report


def _advice(weight_dtype: str) -> Advice:
    winner = Outcome(Candidate("fsdp", (("fsdp", 8),), 1), report(1.0))
    assert winner.fits
    return Advice(
        "m", TARGET.name, TARGET.chip.name, TARGET.chips, 1, 1024, "bfloat16", "dot", 2**30, (winner,),
        weight_dtype=weight_dtype,
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
