"""Layer stacks of several kinds (`spmd.plan.lower.layer_period`): Gemma 3's five sliding-window
layers then one global layer scan one period a trip, each layer keeping its own window, and the
step-time model costs a windowed kernel over the blocks its window reaches, with the block sizes
given (``--splash-blocks``). The compile runs in a process of its own
(libtpu and torchax stay out of the test session)."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spmd.plan.errors import TracingError
from spmd.plan.lower.layer_period import PeriodCalls, PeriodLayer, layer_period
from spmd.plan.predict._op_costs import attended_pairs, splash_phase
from spmd.plan.request.attention import window_scope
from spmd.plan.request.splash_blocks import SplashBlocks
from tests.spmd.plan.child_compile import on_demand_on_torch_xla, splash_step

# 14 layers: two whole periods of Gemma 3's pattern (layers 5 and 11 global), then two more local ones.
GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 256,
    "intermediate_size": 1024, "num_hidden_layers": 14, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 4096, "sliding_window": 128, "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}  # fmt: skip
SEQ, WINDOW = 1024, 128


# Each kernel's blocks unlike the others' (MaxText's sa_block_ names), so a size that reached the
# wrong kernel, or no kernel, shows in its grid and its cost.
BLOCKS = {"q": 256, "kv": 128, "q_dkv": 128, "kv_dkv": 256, "q_dq": 512, "kv_dq": 128}
COMPILED = splash_step(GEMMA3, ",".join(f"{k}={v}" for k, v in BLOCKS.items()), SEQ)


def _reach(block_q: int, block_kv: int) -> tuple[int, int]:
    """The most key blocks one query block of a local layer reaches, and query blocks one key block."""
    seen = np.tril(np.ones((SEQ, SEQ), bool)) & ~np.tril(np.ones((SEQ, SEQ), bool), -WINDOW)
    run = seen.reshape(SEQ // block_q, block_q, SEQ // block_kv, block_kv).any(axis=(1, 3))
    return int(run.sum(axis=1).max()), int(run.sum(axis=0).max())


@pytest.mark.reads(COMPILED)
@on_demand_on_torch_xla
def test_gemma3_scans_whole_periods_and_each_local_layer_keeps_its_window():
    result = COMPILED.result()
    assert result["scanned"] == 12  # two periods of six; layers 12 and 13 run after the scan
    scope = window_scope(WINDOW, SplashBlocks(**BLOCKS).resolved(SEQ))
    kernels = result["kernels"]
    windowed = {name for name, k in kernels.items() if f"/{scope}/" in k["scope"]}
    forward = {name for name in kernels if splash_phase(name) == "fwd"}
    whole = forward - windowed
    # forward kernels in the program: one period's six layers in the scan and the two after it; 7 of
    # those 8 layers are local (dots remat runs each layer's forward kernel again in backward)
    assert whole and len(forward & windowed) == 7 * len(whole), kernels


@pytest.mark.reads(COMPILED)
@on_demand_on_torch_xla
def test_each_splash_kernel_runs_the_blocks_given_and_is_costed_by_them():
    result = COMPILED.result()
    kernels, flops = result["kernels"], result["flops"]
    # the kernel's block tables: forward's and dq's a row a query block, dkv's a column a key block;
    # a local layer's table keeps only as many of the other blocks as its window reaches
    tables = {
        "fwd": (1, SEQ // BLOCKS["q"], _reach(BLOCKS["q"], BLOCKS["kv"])[0]),
        "dq": (1, SEQ // BLOCKS["q_dq"], _reach(BLOCKS["q_dq"], BLOCKS["kv_dq"])[0]),
        "dkv": (1, _reach(BLOCKS["q_dkv"], BLOCKS["kv_dkv"])[1], SEQ // BLOCKS["kv_dkv"]),
    }
    for name, kernel in kernels.items():
        phase = splash_phase(name)  # jax 0.7 names a forward kernel with its sizes, "block_kv_dkv" among them
        grid, want = tuple(int(n) for n in kernel["grid"].split(",")), tables[phase]
        if "splash_window" in kernel["scope"]:
            assert grid == want, (name, grid, want)
        else:  # causal: the whole table, a row (a column for dkv) a block
            axis = 2 if phase == "dkv" else 1
            assert grid[axis] == want[axis], (name, grid)
    # a local kernel runs the pairs of blocks its 128 keys reach, a global one those the causal
    # mask reaches (each kernel's own blocks, read from its declaration)
    blocks = {"fwd": (BLOCKS["q"], BLOCKS["kv"]), "dkv": (BLOCKS["q_dkv"], BLOCKS["kv_dkv"])}
    blocks["dq"] = (BLOCKS["q_dq"], BLOCKS["kv_dq"])
    for kind, pair in blocks.items():
        ratio = attended_pairs(SEQ, SEQ, WINDOW, pair) / attended_pairs(SEQ, SEQ, None, pair)
        local = [n for n in flops if splash_phase(n) == kind and "splash_window" in kernels[n]["scope"]]
        causal = [n for n in flops if splash_phase(n) == kind and "splash_window" not in kernels[n]["scope"]]
        assert local and causal, (kind, sorted(flops))
        for name in local:
            assert flops[name] == pytest.approx(flops[causal[0]] * ratio), name
    assert attended_pairs(SEQ, SEQ, WINDOW, blocks["fwd"]) > attended_pairs(SEQ, SEQ, WINDOW)


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
    calls = PeriodCalls()
    run = lambda hidden, calls: ran.append((hidden, sorted(calls.arguments))) or "out"  # noqa: E731
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
    stand_in = PeriodLayer(layer, 0, 1, 1, PeriodCalls(), lambda hidden, calls: hidden)
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
