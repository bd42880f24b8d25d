"""Host-offloaded residuals (`spmd.plan.lower.residuals`): the forward layer scan writes each host
stack in the layout the backward scan reads, so no whole stack crosses between host and device
between the scans. With the out projection offloaded, libtpu wrote it and the layer input sequence
minor-most and read them row-major: each stack went to the device, was copied and went back (the
v6e 8B's 2.15 s a step, docs/plan.md). The compile runs in a process of its own (libtpu and torchax stay out of the
test session)."""

import re

import pytest

from tests.spmd.plan.child_compile import on_demand_on_torch_xla, python_code

# 4 layers (no other dim is 4), width 512, 4 query heads and 1 K/V head of 128: the 8B's recipe in
# small, which showed the two relaid stacks (bf16[4,2,2048,512]) before the fix. One sequence of
# 1024 a device shows them too (bf16[4,1,1024,512], measured with the fix patched out) in a third
# of the compile's CPU (17 s, against 53 s for two sequences of 2048).
LLAMA = {
    "model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 1024,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}  # fmt: skip
RECIPE = "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,value_proj=offload,out_proj=offload"

COMPILE = """
import json, re, sys
from spmd.plan.api import _lower, _request
from spmd.plan.compile.step import compile_step
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings

settings = PlanSettings("v6e-8", 1, 1024, "bfloat16", "flash")
module, hf_config = build_meta_model(sys.argv[1])
lowered, _, _ = _lower(_request(settings, "fsdp", None, 8, sys.argv[2], 4), module, hf_config, 1024, None)
hlo = compile_step(lowered.lowered).hlo_text
host_stack = r"bf16\\[4,[\\d,]+\\]\\{[^}]*S\\(5\\)\\}"  # 4 layers, in host memory
print(json.dumps({
    "host_stacks": sorted(set(re.findall(host_stack, hlo))),
    "copies": [m.group(1) for m in re.finditer(r"= (\\(.*?\\)) copy-start\\(", hlo) if re.search(host_stack, m.group(1))],
}))
"""


RELAID = python_code(COMPILE, LLAMA, RECIPE, timeout=1200)


@pytest.mark.reads(RELAID)
@on_demand_on_torch_xla
def test_no_host_stack_is_relaid_between_the_layer_scans():
    out = RELAID.result()
    # per device: 4 layers x 1 sequence x 1024 tokens; the layer input, q and the out projection
    # 512 wide, k and v 128: the five offloaded stacks are in host memory (S(5))
    widths = {re.match(r"bf16\[4,1,1024,(\d+)\]", s).group(1) for s in out["host_stacks"]}
    assert widths == {"512", "128"}, out["host_stacks"]
    assert out["copies"] == [], out["copies"]  # a whole stack to or from the host: a relayout's round trip


LOWER = """
import json, sys
from spmd.plan.api import _lower, _request
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings

settings = PlanSettings("v6e-8", 1, 2048, "bfloat16", "flash")
module, hf_config = build_meta_model(sys.argv[1])
counts = {}
for remat in sys.argv[2:]:
    lowered, _, _ = _lower(_request(settings, "fsdp", None, 16, remat, 4), module, hf_config, 2048, None)
    counts[remat] = lowered.lowered.as_text().count("@LayoutConstraint")
print(json.dumps(counts))
"""


POLICIES = (
    "dots", "full", "offload",
    "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,value_proj=offload",
    RECIPE, "custom:out_proj=device,mlpwo=offload",
)  # fmt: skip
PINNED = python_code(LOWER, LLAMA, *POLICIES, timeout=1200)


@pytest.mark.reads(PINNED)
def test_only_plans_that_offload_what_a_block_adds_to_the_stream_pin_a_layout():
    """Plans that keep no out projection (or MLP output) on the host lower as before (no layout
    constraint), so their programs and calibrated predictions stay as they were: ``offload`` (the
    Ironwood 405B's calibration run) and the v6e 70B's recipe among them."""
    counts = PINNED.result()
    assert [counts[p] for p in POLICIES[:4]] == [0, 0, 0, 0], counts
    assert counts[RECIPE] > 0 and counts[POLICIES[5]] > 0, counts  # out_proj, mlpwo: pinned on both sides
