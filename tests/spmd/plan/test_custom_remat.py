"""``--remat custom:...`` (`spmd.plan.request.custom_remat`): MaxText's per-tensor choices. What the
block scan keeps, on the device and on the host, is JAX's own residual list of the lowered step
(a process of its own: libtpu gives the devices), held to the choices and to our memory math."""

import pytest

from spmd.plan import PlanError
from spmd.plan.__main__ import parser
from spmd.plan.request.custom_remat import CustomRemat
from spmd.plan.request.remat import Remat, jax_policy, kernel_residual_name, recompute_factor
from tests.spmd.plan.child_compile import python_code

# q: 4 heads of 64 (256), k and v: 1 head (64), MLP 640, width 320: each projection its own width.
LLAMA = {
    "model_type": "llama", "hidden_size": 320, "intermediate_size": 640, "num_hidden_layers": 2,
    "num_attention_heads": 5, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 1024,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}  # fmt: skip
POLICY = "custom:decoder_layer_input=offload,query_proj=offload,key_proj=device,value_proj=device,out_proj=remat"

LOWER = """
import json, sys
from spmd.plan.api import _lower, _request
from spmd.plan.predict.memory import model_shape, saved_per_token
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings

settings = PlanSettings("v5e:2x2", 1, 256, "bfloat16", "dot")
module, hf_config = build_meta_model(sys.argv[1])
req = _request(settings, "fsdp", None, 8, sys.argv[2], 4)
lowered, _, _ = _lower(req, module, hf_config, 256, None)
shape = model_shape(hf_config, sum(p.numel() for p in module.parameters()))
saved = [[list(a.shape), a.dtype, a.on_host] for a in lowered.saved_per_layer]
print(json.dumps({"saved": saved, "math": list(saved_per_token(shape, req.remat, settings.attention, 256)),
                  "value": req.remat.value}))
"""


KEPT = python_code(LOWER, LLAMA, POLICY, timeout=900)


@pytest.mark.reads(KEPT)
def test_each_tensor_is_kept_where_its_choice_says():
    out = KEPT.result()
    # global shapes of one layer, batch 8 x 256 tokens: the input (320) and q (320 = 5 x 64) on the
    # host, k and v (64 each) on the device, the out projection computed again
    device = sorted(tuple(s) for s, _, host in out["saved"] if not host)
    host = sorted(tuple(s) for s, _, on in out["saved"] if on)
    assert device == [(8, 256, 64), (8, 256, 64)], out["saved"]
    assert host == [(8, 256, 320), (8, 256, 320)], out["saved"]
    assert all(dtype == "bfloat16" for _, dtype, _ in out["saved"])
    assert out["math"] == [2 * 64 * 2, 2 * 320 * 2]  # our memory math: bytes a token, device and host
    assert out["value"] == POLICY.replace(",out_proj=remat", "")


def test_custom_choices_answer_as_the_presets_they_equal():
    offload = Remat.parse("custom:decoder_layer_input=offload")
    assert (offload.saved_names, offload.checkpoints_block) == ((), True)
    assert recompute_factor(offload, 0.1, 0.3, 0.1) == recompute_factor(Remat.OFFLOAD, 0.1, 0.3, 0.1)
    qkv_context = Remat.parse("custom:context=device,query_proj=device,key_proj=device,value_proj=device")
    assert set(qkv_context.saved_names) == set(Remat.SAVE_QKV_CONTEXT.saved_names) - {"qkv_proj"}
    assert kernel_residual_name(qkv_context) == kernel_residual_name(Remat.SAVE_QKV_CONTEXT)
    assert recompute_factor(qkv_context, 0.1, 0.3, 0.1) == recompute_factor(Remat.SAVE_QKV_CONTEXT, 0.1, 0.3, 0.1)
    offloaded_context = Remat.parse("custom:context=offload,query_proj=device")
    assert kernel_residual_name(offloaded_context) == kernel_residual_name(Remat.SAVE_QKV_CONTEXT)
    assert callable(jax_policy(offloaded_context))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("custom:", "name=choice pairs"),
        ("custom:attn_out=device", "unknown tensor 'attn_out'"),
        ("custom:query_proj=host", "choose one of"),
        ("custom:query_proj=device,query_proj=remat", "given twice"),
    ],
)
def test_bad_custom_policies_are_refused(text, says, capsys):
    with pytest.raises(PlanError, match=says):
        CustomRemat.parse(text)
    with pytest.raises(SystemExit):
        parser().parse_args(["gpt2", "--topology", "v5e-8", "--remat", text])
    assert says.split("'")[0] in capsys.readouterr().err
