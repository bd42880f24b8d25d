"""fsdp_xla.FSDP on the dtensor backend (torch's fully_shard per unit) under torchrun, gloo, 4 ranks:
numerics against eager single-process training, mixed precision, and deferred init giving the
GSPMD backend's weights for the same seed."""

import json
from pathlib import Path

import pytest
import torch

from fsdp_xla import FSDP, deferred_init, transformer_auto_wrap_policy
from tests.fsdp_xla.helpers import GPT, SMALL, Block, fsdp_mesh
from tests.torchrun import torchrun

WORKER = Path(__file__).with_name("dtensor_fsdp_worker.py")


@pytest.fixture(scope="module")
def dtensor_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dtensor_fsdp")
    run = torchrun(WORKER, 4, str(out))
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads((out / "results.json").read_text()), torch.load(out / "deferred.pt")


def test_five_adamw_steps_equal_eager_single_process(dtensor_run):
    result, _ = dtensor_run
    assert result["sharded"]  # every parameter is a DTensor holding its shard only
    assert result["losses"] == pytest.approx(result["eager_losses"], rel=1e-5)
    assert result["losses"][-1] < result["losses"][0]
    # Adam amplifies rounding: bound by what summing the batch in 4 parts does in one process.
    assert result["param_diff"] <= max(3e-5, 3 * result["rounding_floor"]), result


def test_mixed_precision_keeps_fp32_master_weights(dtensor_run):
    result, _ = dtensor_run
    assert result["bf16_param_dtypes"] == ["torch.float32"]
    assert result["bf16_loss"] == pytest.approx(result["eager_losses"][0], rel=0.02)


def test_deferred_init_equals_the_gspmd_backend(dtensor_run, xla):
    _, dtensor_weights = dtensor_run
    gspmd = FSDP(deferred_init(GPT, **SMALL), mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    gspmd_weights = {k: v.cpu() for k, v in gspmd.state_dict().items()}
    assert set(gspmd_weights) == set(dtensor_weights)
    for k, v in gspmd_weights.items():
        assert torch.equal(dtensor_weights[k], v), k
