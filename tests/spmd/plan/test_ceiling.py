"""The MFU ceiling the advisor rules plans out with (`spmd.plan.predict.ceiling`), against compiled plans;
and the advisor's search against every plan it could have tried, each compiled (plan_worker.py's
``every_plan``: a small Llama on v5e:2x2)."""

import pytest

from spmd.plan.advisor.advisor import _ceilings
from spmd.plan.predict._calibration import CALIBRATION
from spmd.plan.predict.ceiling import mfu_ceiling, recompute_floor
from spmd.plan.predict.memory import model_shape
from spmd.plan.request.models import BUILTIN_CONFIGS, _hf_config, build_meta_model
from spmd.plan.request.remat import Remat
from spmd.plan.request.settings import PlanSettings
from tests.spmd.plan import plan_results


@pytest.fixture(scope="module")
def every(worker):
    results, out = worker
    if "every_plan" not in results:
        pytest.skip("the advisor against every plan runs on the current lane (plan_results.CURRENT_LANE_ONLY)")
    module, hf_config = build_meta_model(str(out / "tiny_llama.json"))
    shape = model_shape(hf_config, sum(p.numel() for p in module.parameters()))
    return results["every_plan"], shape


@pytest.fixture(scope="module")
def worker():
    return plan_results.results()


def test_the_floor_of_llama_70b_and_its_ceilings_fall_with_recomputation():
    shape = model_shape(_hf_config(BUILTIN_CONFIGS["llama3.1-70b"]), 70_553_706_496)
    floors = {r.value: round(recompute_floor(shape, r, 8192), 3) for r in Remat}
    # none, dots: nothing certain; save_qkv_context runs the output projection and the MLP's
    # input projections again; the two that keep no MLP output its input projections; full and
    # offload q, k, v, attention and the MLP input too (the program measured 1.23 x with
    # save_dot_except_mlp and 1.28 x with full: docs/plan.md).
    assert floors == {
        "none": 1.0, "dots": 1.0, "save_qkv_context": 1.191, "save_dot_except_mlp": 1.167, "save_qkv_proj": 1.167,
        "full": 1.221, "offload": 1.221,
    }  # fmt: skip
    ceilings = [mfu_ceiling(shape, r, 8192, "tpu7x") for r in Remat]
    assert ceilings[-1] == pytest.approx(max(CALIBRATION.efficiencies("tpu7x")) / 1.2211, abs=1e-4)
    assert mfu_ceiling(None, Remat.FULL, 8192, "tpu7x") is None
    # save_qkv_context is tried before two policies of a higher ceiling (it keeps about their memory):
    # the ceiling a search rules a policy out by is the highest of it and every later one, never rising
    settings = PlanSettings("tpu7x-128", seq_len=8192)
    remats = tuple(r.value for r in Remat)
    searched = [_ceilings(shape, settings, remats)(r) for r in remats]
    assert searched == sorted(searched, reverse=True)
    assert searched[2] == max(ceilings[2:]) > ceilings[2]


def test_fsdp_plans_run_at_least_their_floor_and_stay_under_their_ceiling(every):
    found, shape = every
    for plan in found["every"]:
        r, remat = plan["report"], Remat(plan["remat"])
        estimate = r["estimate"]
        if not estimate["predicted_seconds"]:
            continue  # out of memory: no program, no prediction
        ratio = estimate["hardware_flops_per_device"] * r["devices"] / estimate["model_flops_per_step"]
        assert ratio >= recompute_floor(shape, remat, r["seq_len"]), plan
        assert estimate["predicted_mfu"] <= mfu_ceiling(shape, remat, r["seq_len"], "v5e"), plan


def test_the_advisor_s_winner_is_the_best_plan_on_its_frontier(every):
    """The search compiles each policy's largest fitting batch, a heavier policy only beyond every
    lighter one's (MaxText's frontier of batch against policy), not every batch: its winner is the
    best of that frontier, read from every plan compiled apart."""
    found, _ = every
    advice = found["advice"]
    compiled = [o for o in advice["outcomes"] if o["report"] is not None]
    assert len(compiled) < len(found["every"])  # fewer compiles than plans
    frontier, beyond = [], 0
    for remat in Remat:  # least recomputation first
        fitting = [p for p in found["every"] if p["remat"] == remat.value and p["report"]["fits"]]
        largest = max(fitting, key=lambda p: p["batch"], default=None)
        if largest is not None and largest["batch"] > beyond:
            frontier.append(largest)
            beyond = largest["batch"]
    best = max(frontier, key=lambda p: p["report"]["estimate"]["predicted_mfu"])
    winner = next(o for o in advice["outcomes"] if o["report"] is not None and o["report"]["fits"])
    assert (winner["remat"], winner["per_device_batch"]) == (best["remat"], best["batch"])
    assert winner["report"]["estimate"]["predicted_mfu"] == best["report"]["estimate"]["predicted_mfu"]
