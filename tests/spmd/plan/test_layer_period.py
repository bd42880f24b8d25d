"""Layer stacks of several kinds (`spmd.plan.lower.layer_period`): Gemma 3's five sliding-window
layers then one global layer scan one period a trip, each layer keeping its own window, and the
step-time model costs a windowed kernel over its window. The compile runs in a process of its own
(libtpu and torchax stay out of the test session)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spmd.plan.errors import TracingError
from spmd.plan.lower.layer_period import PeriodLayer, layer_period
from tests.spmd.plan.child_compile import python_code

# 14 layers: two whole periods of Gemma 3's pattern (layers 5 and 11 global), then two more local ones.
GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 256,
    "intermediate_size": 1024, "num_hidden_layers": 14, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 4096, "sliding_window": 128, "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}  # fmt: skip
SEQ, WINDOW = 1024, 128

COMPILE = """
import json, sys
from spmd.hlo import HloModuleText
from spmd.plan.api import _lower, _request
from spmd.plan.compile.step import compile_step
from spmd.plan.predict import predict_step
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings

settings = PlanSettings("v5e:2x2", 1, 1024, "bfloat16", "flash", None, "float32", 1)
module, hf_config = build_meta_model(sys.argv[1])
request = _request(settings, "fsdp", None, 4, "dots", 4)
lowered, _, _ = _lower(request, module, hf_config, 1024, None)
hlo = compile_step(lowered.lowered).hlo_text
scopes = {
    inst.name: inst.metadata.get("op_name", "")
    for instructions in HloModuleText.parse(hlo).computations.values()
    for inst in instructions
    if inst.name.startswith("splash_mha_fwd")
}
flops = {e.op: e.flops_per_run for e in predict_step(hlo, request.target).flops_by_op if e.op in scopes}
print(json.dumps({"scanned": lowered.scanned_layers, "scopes": scopes, "flops": flops}))
"""

COMPILED = python_code(COMPILE, GEMMA3, timeout=1200)


def test_gemma3_scans_whole_periods_and_each_local_layer_keeps_its_window():
    result = COMPILED.result()
    assert result["scanned"] == 12  # two periods of six; layers 12 and 13 run after the scan
    windowed = [name for name, scope in result["scopes"].items() if f"/splash_window_{WINDOW}/" in scope]
    whole = [name for name in result["scopes"] if name not in windowed]
    # forward kernels in the program: one period's six layers in the scan and the two after it; 7 of
    # those 8 layers are local (dots remat runs each layer's forward kernel again in backward)
    assert whole and len(windowed) == 7 * len(whole), result["scopes"]
    # a local kernel does each query's 128 keys, not the causal half of 1,024
    ratio = (WINDOW * SEQ - WINDOW * (WINDOW - 1) / 2) / (SEQ * SEQ / 2)
    for name in windowed:
        assert result["flops"][name] == pytest.approx(result["flops"][whole[0]] * ratio), name


def test_gemma3_s_period_is_its_pattern_of_six_and_llama_s_is_one():
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    config = AutoConfig.for_model(**{k: v for k, v in GEMMA3.items() if k != "architectures"})
    with torch.device("meta"):
        gemma = AutoModelForCausalLM.from_config(config)
        llama = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=5,
                                             num_attention_heads=4, vocab_size=100))  # fmt: skip
    assert layer_period(gemma.model.layers) == 6
    assert layer_period(llama.model.layers) == 1


class Block(torch.nn.Module):
    def __init__(self, window: int | None):
        super().__init__()
        self.attention = torch.nn.Module()
        self.attention.sliding_window = window


@given(st.lists(st.sampled_from([None, 4, 8]), min_size=1, max_size=6), st.integers(1, 4), st.integers(0, 5))
def test_the_period_is_the_shortest_run_that_repeats(pattern, repeats, extra):
    windows = (pattern * (repeats + 1))[: len(pattern) * repeats + min(extra, len(pattern) - 1)]
    period = layer_period(torch.nn.ModuleList(Block(w) for w in windows))
    assert all(w == windows[i % period] for i, w in enumerate(windows))
    assert not any(all(w == windows[i % p] for i, w in enumerate(windows)) for p in range(1, period))
    assert period <= len(pattern)


def stand_ins(layers: int, period: int, ran: list) -> list[PeriodLayer]:
    calls: dict = {}
    run = lambda hidden, calls: ran.append((hidden, sorted(k for k in calls if isinstance(k, int)))) or "out"  # noqa: E731
    return [PeriodLayer(Block(None), i, layers, period, calls, run) for i in range(layers)]


def test_the_last_stand_in_runs_the_stack_with_the_first_period_s_arguments():
    ran: list = []
    hidden = object()
    layers = stand_ins(5, 2, ran)
    for layer in layers[:-1]:
        assert layer(hidden, "mask") is hidden and not ran
    assert layers[-1](hidden) == "out"
    assert ran == [(hidden, [0, 1])]
    layer = Block(8)
    layer.attention_type = "sliding_attention"  # some models' loops read it from the layer
    stand_in = PeriodLayer(layer, 0, 1, 1, {}, lambda hidden, calls: hidden)
    assert stand_in.attention_type == "sliding_attention" and not hasattr(stand_in, "attention")


@pytest.mark.parametrize("order", [[0, 2], [1], [0, 0]])
def test_a_model_that_skips_or_reorders_layers_is_refused(order):
    layers = stand_ins(4, 2, [])
    hidden = object()
    with pytest.raises(TracingError, match="call every layer once, in order"):
        for i in order:
            layers[i](hidden)


def test_hidden_states_changed_between_layers_are_refused():
    layers = stand_ins(3, 1, [])
    layers[0](object())
    with pytest.raises(TracingError, match="on other hidden states"):
        layers[1](object())
