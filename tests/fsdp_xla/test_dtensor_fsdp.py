"""fsdp_xla.FSDP on the dtensor backend (torch's fully_shard per unit) under torchrun, gloo, 4 ranks:
numerics against eager single-process training (also with gradient checkpointing, param_spec_fn
and shard_output), mixed precision, deferred init giving the GSPMD backend's weights for the
same seed, and one step's collectives as torch's CommDebugMode counts them. The options FSDP2 cannot express are refused in this process, before any sharding."""

import json

import numpy as np
import pytest
import torch

from fsdp_xla import FSDP, FSDPError, deferred_init, transformer_auto_wrap_policy
from mesh import Mesh
from spmd import P
from spmd._backend import use_backend
from spmd._util import torch_compat
from tests.fsdp_xla.helpers import GPT, SMALL, Block, fsdp_mesh
from tests.torchrun import WORKERS, warm_launch

WORKER = WORKERS / "dtensor_fsdp_worker.py"


@pytest.fixture(scope="module")
def dtensor_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dtensor_fsdp")
    run = warm_launch(WORKER, 4, str(out))
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads((out / "results.json").read_text()), torch.load(out / "deferred.pt")


def test_five_adamw_steps_equal_eager_single_process(dtensor_run):
    result, _ = dtensor_run
    assert result["sharded"]  # every parameter is a DTensor holding its shard only
    assert result["losses"] == pytest.approx(result["eager_losses"], rel=1e-5)
    assert result["losses"][-1] < result["losses"][0]
    # Adam amplifies rounding: bound by what summing the batch in 4 parts does in one process.
    assert result["param_diff"] <= max(3e-5, 3 * result["rounding_floor"]), result
    wrapped, holder = result["wrap_errors"]  # FSDP again: torch's FSDPModule counts as wrapped
    assert "FSDPGPT is already wrapped by FSDP; wrap a model once" in wrapped
    assert "Submodule '0' is already wrapped" in holder


def test_fsdp_and_checkpoints_on_a_permuted_mesh(dtensor_run):
    """FSDP's gathers and reduce-scatters on a reversed mesh train as eager does, and its
    checkpoint resumes on an in-order mesh with the same losses (torch 2.15; 2.9 refuses the
    mesh, tests/spmd/test_dtensor_backend.py)."""
    result, _ = dtensor_run
    if not torch_compat.ordered_groups_supported():
        pytest.skip("this torch cannot order process groups as a permuted mesh does (torch 2.9)")
    assert result["permuted_losses"] == pytest.approx(result["eager_losses"], rel=1e-5)
    assert result["permuted_param_diff"] <= max(3e-5, 3 * result["rounding_floor"]), result
    assert result["permuted_local_rows"] == 16  # vocab 64 over 4 ranks: each holds its quarter
    assert result["resumed_extra"] == {"steps": 3}
    assert result["resumed_losses"] == pytest.approx(result["permuted_losses"][3:], rel=1e-5)


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


def test_one_step_sends_what_zero3_does(dtensor_run):
    """Per phase, from torch's CommDebugMode: each unit's flat all-gather in forward, again in
    backward but the root's (FSDP2 keeps the root gathered), one reduce-scatter per unit; bytes
    by the ring algorithm (the example's dims divide by 4 ranks: no padding)."""
    result, _ = dtensor_run
    assert result["traffic"] == {
        "forward-gather": {"all-gather": 4},  # the root and 3 blocks
        "backward-gather": {"all-gather": 3},
        "gradient-reduction": {"reduce-scatter": 4},
    }
    moved = result["param_bytes"] * 3 // 4  # P (N - 1) / N
    assert result["traffic_bytes"] == {
        "forward-gather": moved,
        "backward-gather": (result["param_bytes"] - result["root_param_bytes"]) * 3 // 4,
        "gradient-reduction": moved,
        "other": 0,
    }


def test_checkpointing_param_spec_fn_and_shard_output_train_as_eager(dtensor_run):
    result, _ = dtensor_run
    assert result["options_losses"] == pytest.approx(result["eager_losses"], rel=1e-5)
    assert result["options_param_diff"] <= max(3e-5, 3 * result["rounding_floor"]), result
    assert result["options_forwards_in_first_step"] == 2  # block 0 ran again in backward: checkpointed
    placements = result["options_placements"]
    assert placements["h.0.c_fc.weight"] == ["Shard(dim=1)"]  # param_spec_fn's P(None, 'fsdp')
    assert placements["wte.weight"] == ["Shard(dim=1)"]  # tied with lm_head: one parameter
    assert placements["wpe.weight"] == ["Shard(dim=0)"] and placements["h.0.c_fc.bias"] == ["Shard(dim=0)"]


@pytest.fixture
def on_dtensor():
    use_backend("dtensor")  # no process group: every check below comes before one is needed
    try:
        yield
    finally:
        use_backend(None)


def policy():
    return transformer_auto_wrap_policy({Block})


@pytest.mark.smoke
@pytest.mark.parametrize(
    "options, message",
    [
        (dict(shard_output=lambda out, mesh: out), "a function written for GSPMD"),
        (
            dict(shard_output=P(None, "fsdp")),
            r"shard_output=P\(None, 'fsdp'\): .* split on dim 0 over 'fsdp' \(P\('fsdp'\)\) and nothing else",
        ),
        (dict(param_spec_fn=lambda name, p: P("fsdp", "model") if p.dim() == 2 else P("fsdp")), r"\['model'\] besides"),
        (dict(param_spec_fn=lambda name, p: P()), "'wte.weight' of shape \\(64, 64\\) the spec .* replicates it"),
    ],
)
def test_options_fully_shard_cannot_express_are_refused_before_sharding(on_dtensor, options, message):
    model = GPT(**SMALL)
    mesh = Mesh(np.arange(4), (2, 2), ("fsdp", "model"))
    with pytest.raises(FSDPError, match=message):
        FSDP(model, mesh=mesh, auto_wrap_policy=policy(), **options)
    assert type(model) is GPT and all(type(p) is torch.nn.Parameter for p in model.parameters())  # untouched


def test_a_spec_fn_value_that_is_no_spec_names_the_parameter(on_dtensor):
    with pytest.raises(
        TypeError, match=r"param_spec_fn returned 'fsdp' for parameter 'wte.weight' of shape \(64, 64\), which is not"
    ):
        FSDP(GPT(**SMALL), mesh=Mesh(np.arange(4), (4,), ("fsdp",)), param_spec_fn=lambda name, p: "fsdp")


def test_an_uneven_split_of_a_dim_other_than_0_is_refused(on_dtensor):
    mesh = Mesh(np.arange(3), (3,), ("fsdp",))
    with pytest.raises(
        FSDPError, match=r"'wte.weight' of shape \(64, 64\).* dim 1 \(64\) does not divide by the 3 devices"
    ):
        FSDP(
            GPT(**SMALL),
            mesh=mesh,
            auto_wrap_policy=policy(),
            param_spec_fn=lambda name, p: P(*[None] * (p.dim() - 1), "fsdp"),
        )
