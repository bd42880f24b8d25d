"""The roofline's recomputation: each remat policy runs again the forward of what it does not keep."""

import pytest

from spmd.plan.predict.estimate import model_flops
from spmd.plan.request.models import BUILTIN_CONFIGS, _hf_config
from spmd.plan.request.remat import Remat, recompute_factor


def test_each_policy_recomputes_more_than_the_one_that_keeps_more():
    config = _hf_config(BUILTIN_CONFIGS["llama3.1-70b"])
    _, shares = model_flops(config, 70_553_706_496, 8192)
    factor = {remat: recompute_factor(remat, **shares) for remat in Remat}
    assert factor[Remat.NONE] == 1.0
    assert factor[Remat.FULL] == factor[Remat.OFFLOAD] == 4 / 3
    # dots keeps every projection; except-mlp runs the MLP's gate and up projections again;
    # qkv-only runs the output projection too; full the whole forward.
    assert 1.0 < factor[Remat.DOTS] < factor[Remat.SAVE_DOT_EXCEPT_MLP] < factor[Remat.SAVE_QKV_PROJ] < 4 / 3
    # Llama 3.1-70B: the MLP's two input projections, 2 x 8192 x 28672 x 2 FLOPs a token a layer
    # forward, are about half of its matmul FLOPs at 8k.
    assert 0.5 < shares["mlp_share"] < 0.6
    assert factor[Remat.SAVE_DOT_EXCEPT_MLP] - factor[Remat.DOTS] == pytest.approx(shares["mlp_share"] / 3)
    # save_qkv_context keeps attention's output: the output projection runs again instead of attention,
    # as much at 8k (2 x 8192 x 8192 a token a layer, causal) and far less at 131,072 tokens
    assert factor[Remat.SAVE_QKV_CONTEXT] == pytest.approx(1 + (shares["mlp_share"] + shares["out_share"]) / 3)
    assert factor[Remat.SAVE_QKV_CONTEXT] == pytest.approx(factor[Remat.SAVE_DOT_EXCEPT_MLP])
    _, long = model_flops(config, 70_553_706_496, 131072)
    assert recompute_factor(Remat.SAVE_QKV_CONTEXT, **long) < recompute_factor(Remat.SAVE_DOT_EXCEPT_MLP, **long) - 0.1


def test_a_model_of_no_known_shape_has_no_shares():
    per_token, shares = model_flops(object(), 1_000_000, 128)
    assert per_token == 6 * 1_000_000 and shares == {}
