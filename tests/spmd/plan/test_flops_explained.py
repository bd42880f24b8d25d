"""The FLOPs the step-time model counts, explained op by op (`StepEstimate.flops_by_loop`,
``flops_by_op``; `--json`), and named in the table when the program runs more than 1.35 x the
model's FLOPs. Pure Python: a hand-written program of one loop (tests/spmd/plan/test_step_time.py)."""

import json

import pytest

from spmd.plan.predict._step_time import predict_step
from spmd.plan.predict.estimate import estimate_step
from spmd.plan.report.plan_report import CollectiveSummary, MemoryReport, PlanReport
from spmd.plan.request.remat import Remat
from spmd.plan.request.topology import parse_slice
from tests.spmd.plan.test_step_time import CAL, LOOP

TARGET = parse_slice("tpu7x:2x2x1")  # 8 devices
TOKENS, SEQ = 8 * 1024, 1024


def report(model_over_program: float) -> PlanReport:
    """A report of LOOP's program (5 trips of a 4096^3 dot a device) for a model whose FLOPs are
    ``model_over_program`` x the program's (6 N a token, N chosen so)."""
    step = predict_step(LOOP, TARGET, CAL)
    n_params = round(step.hardware_flops * TARGET.devices * model_over_program / 6 / TOKENS)
    estimate = estimate_step(TARGET, None, n_params, TOKENS, SEQ, Remat.DOTS, [], step)
    memory = MemoryReport(
        2, argument_bytes=1, temp_bytes=1, predicted_argument_bytes=1, hbm_bytes=2**30, compiler_accepted=True
    )
    return PlanReport(
        "m", TARGET.name, TARGET.chip.name, TARGET.chips, TARGET.devices, 1, {"fsdp": 8}, "fsdp", 8, SEQ,
        "bfloat16", "dots", "dot", n_params, 0, memory, (CollectiveSummary("all-gather", 0, 0),), 0.0, 0.0,
        estimate, 1.0,
    )  # fmt: skip


def test_the_json_explains_every_flop_by_loop_and_op():
    r = report(0.5)
    e = r.estimate
    (loop,) = e.flops_by_loop
    assert loop["loops"] == [["w", 5]] and loop["ops"] == 1
    assert loop["flops"] == e.hardware_flops_per_device == 5 * 2 * 4096**3
    assert loop["of_model"] == pytest.approx(2.0)
    (op,) = e.flops_by_op
    assert (op["op"], op["opcode"], op["runs"], op["flops_per_run"]) == ("d", "dot", 5, 2 * 4096**3)
    assert PlanReport.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_a_program_running_more_than_1_35_x_the_model_s_flops_says_where():
    table = report(0.5).table()
    assert "the program runs 2.00 x the model's FLOPs" in table
    assert "where the program's FLOPs are" in table
    assert " 2.00  1 ops in w x5" in table
    assert "where the program's FLOPs are" not in report(1 / 1.3).table()
