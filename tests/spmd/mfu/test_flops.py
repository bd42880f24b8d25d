"""FLOP counting and MFU arithmetic against published figures and hand calculations."""

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spmd.errors import MfuError, SpmdTypeError
from spmd.mfu import (
    TransformerShape,
    chip_for_device_kind,
    matmul_flops_per_token,
    mfu,
    palm_flops_per_token,
    six_n_flops_per_token,
)
from spmd.mfu.flops import forward_matmul_flops_per_token

GPT2_124M = TransformerShape(
    n_layer=12,
    d_model=768,
    n_head=12,
    head_dim=64,
    d_ff=3072,
    vocab=50257,
    n_kv_head=12,
    gated_mlp=False,
    n_params=124_439_808,
    n_embedding_params=1024 * 768,  # wpe; wte is tied to the LM head, so it stays in N
)


def test_blog_table_1_gpt2_20b_on_v4_128():
    """PyTorch/XLA FSDP blog, Table 1, GPT-2 20B on v4-128 (64 chips): 524,288 tokens per step,
    about 19.7 B parameters, 62 PFLOP per step, 7.824 s, 275 TFLOP/s per v4 chip:
    62e15 / 7.824 / 64 / 275e12 = 45.0 % (the blog prints 45.1 % from unrounded figures)."""
    tokens = 524_288
    flops = six_n_flops_per_token(19.7e9) * tokens
    assert flops / 1e15 == pytest.approx(62.0, rel=0.01)
    chip = chip_for_device_kind("TPU v4")
    assert mfu(flops, 7.824, 64, chip.peak_flops) == pytest.approx(0.450, abs=0.0015)
    assert mfu(62e15, 7.824, 64, chip.peak_flops) == pytest.approx(0.450, abs=0.0005)


def test_palm_formula_on_gpt2_124m():
    """By hand, for HF GPT-2 124M (L 12, H 12, Q 64, T 1024):
    N = 124,439,808 - 786,432 (wpe) = 123,653,376;
    6N = 741,920,256; 12 L H Q T = 12 * 12 * 12 * 64 * 1024 = 113,246,208;
    per token 855,166,464 (nanoGPT's figure for the same model)."""
    assert palm_flops_per_token(GPT2_124M, 1024) == 855_166_464


def test_per_matmul_count_on_gpt2_124m():
    """By hand, forward per token per layer: QKV 2*768*2304 = 3,538,944; causal attention
    4*1024*768/2 = 1,572,864; output 2*768*768 = 1,179,648; MLP 2*2*768*3072 = 9,437,184;
    sum 15,728,640, x 12 = 188,743,680; unembedding 2*768*50257 = 77,194,752; forward
    265,938,432; training x3 = 797,815,296. The embedding lookup does no matmul."""
    assert matmul_flops_per_token(GPT2_124M, 1024) == 797_815_296
    non_causal = matmul_flops_per_token(GPT2_124M, 1024, causal=False)
    assert non_causal - 797_815_296 == 3 * 12 * 1_572_864


def test_six_n_under_counts_long_sequences():
    short, long = 128, 8192
    ratio_short = palm_flops_per_token(GPT2_124M, short) / six_n_flops_per_token(GPT2_124M.n_params)
    ratio_long = palm_flops_per_token(GPT2_124M, long) / six_n_flops_per_token(GPT2_124M.n_params)
    assert ratio_short < 1.02 and ratio_long > 2.0


def test_hf_configs():
    from transformers import GPT2Config, LlamaConfig

    assert TransformerShape.from_hf_config(GPT2Config()) == GPT2_124M
    llama7b = TransformerShape.from_hf_config(
        LlamaConfig(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32000,
        )
    )
    assert llama7b.n_params == 6_738_415_616
    assert palm_flops_per_token(llama7b, 4096) == 46_086_512_640  # torchtitan's 6N + 12LHQT
    with pytest.raises(ValueError, match="No FLOP model for model_type 'bert'"):
        TransformerShape.from_hf_config(type("C", (), {"model_type": "bert"})())


def test_hf_parameter_count_matches_the_model():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    small = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=32)
    assert TransformerShape.from_hf_config(small).n_params == sum(
        p.numel() for p in GPT2LMHeadModel(small).parameters()
    )
    llama = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=100)  # fmt: skip
    assert TransformerShape.from_hf_config(llama).n_params == sum(
        p.numel() for p in LlamaForCausalLM(llama).parameters()
    )


# Gemma 3 12B's text model (google/gemma-3-12b-pt's text_config), as the tpu-recipes run it at 32k.
GEMMA3_12B = {
    "hidden_size": 3840, "intermediate_size": 15360, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 262208, "sliding_window": 1024,
}  # fmt: skip


def test_gemma3_attention_counts_each_local_layers_window_as_maxtext_does():
    from transformers import Gemma3TextConfig

    shape = TransformerShape.from_hf_config(Gemma3TextConfig(**GEMMA3_12B))
    assert (shape.sliding_window, shape.n_sliding_layers) == (1024, 40)  # 5 local layers of every 6
    seq, heads, head_dim = 32768, 16, 256
    # MaxText's calculate_gemma3_tflops_training_per_device, per token of forward: a global layer
    # 4 T H Q, a local one 4 min(W, T) H Q, each halved for the causal mask
    global_layer, local_layer = 4 * seq * heads * head_dim / 2, 4 * 1024 * heads * head_dim / 2
    parts = forward_matmul_flops_per_token(shape, seq)
    assert parts["attention"] == 8 * global_layer + 40 * local_layer
    # without its windows the same model counts every layer over the whole sequence: 5.6 x the attention
    whole = forward_matmul_flops_per_token(replace(shape, sliding_window=None, n_sliding_layers=0), seq)
    assert whole["attention"] == 48 * global_layer
    assert {k: v for k, v in parts.items() if k != "attention"} == {k: v for k, v in whole.items() if k != "attention"}
    # a window holding the whole sequence is no window
    assert forward_matmul_flops_per_token(shape, 1024) == forward_matmul_flops_per_token(
        replace(shape, sliding_window=None, n_sliding_layers=0), 1024
    )


def test_gemma3_12b_at_32k_is_the_training_flops_maxtext_logged():
    """tpu-recipes' Gemma3-12B on 2 x v6e-256 (per-device batch 1 x 32,768 tokens) logs "seconds:
    7.793, TFLOP/s/device: 328.139": 2,557.2 TFLOP a device a step."""
    from transformers import Gemma3TextConfig

    shape = TransformerShape.from_hf_config(Gemma3TextConfig(**GEMMA3_12B))
    assert matmul_flops_per_token(shape, 32768) * 32768 == pytest.approx(7.793 * 328.139e12, rel=1e-4)


def test_hf_parameter_count_of_gemma_models_matches_the_model():
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GemmaConfig,
        GemmaForCausalLM,
    )

    small = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "sliding_window": 8}  # fmt: skip
    for config, model in ((Gemma2Config(**small), Gemma2ForCausalLM), (Gemma3TextConfig(**small), Gemma3ForCausalLM)):
        shape = TransformerShape.from_hf_config(config)
        assert shape.n_params == sum(p.numel() for p in model(config).parameters()), config.model_type
        assert shape.n_sliding_layers == sum(kind == "sliding_attention" for kind in config.layer_types) > 0
    gemma = GemmaConfig(**{k: v for k, v in small.items() if k != "sliding_window"})
    assert TransformerShape.from_hf_config(gemma).n_params == sum(
        p.numel() for p in GemmaForCausalLM(gemma).parameters()
    )


def test_mistral_s_window_covers_every_layer():
    from transformers import LlamaConfig, MistralConfig

    config = MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=100, sliding_window=16)  # fmt: skip
    assert TransformerShape.from_hf_config(config).n_sliding_layers == 3
    config.sliding_window = None
    assert TransformerShape.from_hf_config(config).n_sliding_layers == 0
    llama = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                        vocab_size=100)  # fmt: skip
    llama.sliding_window = 16  # a stray key: Llama's attention takes no window
    assert TransformerShape.from_hf_config(llama).n_sliding_layers == 0


@pytest.mark.parametrize(
    ("window", "sliding", "error", "match"),
    [
        (None, 2, MfuError, "needs a sliding_window"),
        (64, 3, MfuError, "at most n_layer"),
        (0, 1, MfuError, "sliding_window must be None or a positive int"),
        (64, -1, MfuError, "n_sliding_layers must be"),
        (64, 1.5, SpmdTypeError, "n_sliding_layers must be"),
    ],
)
def test_bad_windows_are_refused(window, sliding, error, match):
    with pytest.raises(error, match=match):
        replace(GPT2_124M, n_layer=2, sliding_window=window, n_sliding_layers=sliding)


@given(st.integers(1, 64), st.sampled_from([64, 128, 256]), st.integers(16, 4096))
def test_matmul_count_is_close_to_palm_when_attention_is_small(layers, width, seq):
    shape = TransformerShape(layers, width, width // 64, 64, 4 * width, 1000, width // 64, False,
                             layers * 12 * width * width + 1000 * width, 0)  # fmt: skip
    ours, palm = matmul_flops_per_token(shape, seq, causal=False), palm_flops_per_token(shape, seq)
    assert ours == pytest.approx(palm, rel=0.05)  # same physics, small bias/norm terms aside


def test_bad_input():
    with pytest.raises(ValueError, match="must be a positive int"):
        TransformerShape(0, 1, 1, 1, 1, 1, 1, False, 1, 0)
    with pytest.raises(ValueError, match="step_seconds must be finite and > 0, got 0.0"):
        mfu(1.0, 0.0, 1, 1.0)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: mfu(1e12, NAN, 8, 1e12), ValueError, "step_seconds must be finite and > 0, got nan"),
        (lambda: mfu(1e12, 1, INF, 1e12), ValueError, "chips must be finite and > 0, got inf"),
        (lambda: mfu(-1e12, 1, 8, 1e12), ValueError, "flops_per_step must be finite and >= 0"),
        (lambda: mfu(1e12, 1, 8, INF), ValueError, "peak_flops_per_chip must be finite"),
        (lambda: mfu(-1e-38, 2, 2, 1), ValueError, "flops_per_step must be finite and >= 0"),
        (lambda: mfu(1, 1e-200, 1e-200, 1e-200), ValueError, "mfu overflowed"),
        (lambda: mfu("1", 1, 1, 1), TypeError, r"flops_per_step must be a real number, got '1' \(str\)"),
        (lambda: mfu(1e12, "1", 1, 1), TypeError, "step_seconds must be a real number"),
        (lambda: mfu(1e12, 1, True, 1), TypeError, r"chips must be a real number, got True \(bool\)"),
        (lambda: six_n_flops_per_token(-5), ValueError, "n_params must be finite and >= 0, got -5"),
        (lambda: six_n_flops_per_token("a"), TypeError, "n_params must be a real number"),
        (lambda: matmul_flops_per_token(GPT2_124M, -5), ValueError, "seq_len must be an int >= 1, got -5"),
        (lambda: matmul_flops_per_token(GPT2_124M, 8, causal="no"), TypeError, "causal takes a bool"),
        (lambda: palm_flops_per_token(GPT2_124M, NAN), TypeError, r"seq_len must be an int >= 1, got nan \(float\)"),
        (lambda: palm_flops_per_token(None, 8), TypeError, "shape must be a TransformerShape"),
        (lambda: TransformerShape(2, 64, 4, 16, 256, 100, 4, False, 10000, -5), ValueError, "n_embedding_params"),
        (lambda: TransformerShape(2, 64, 4, 16, 256, 100, 4, "no", 10000, 0), TypeError, "gated_mlp takes a bool"),
        (lambda: TransformerShape(2, 64, 4, 16, 256, 100, 4, False, 100, 5000), ValueError, "exceeds n_params"),
    ],
)
def test_bad_numbers_are_refused_not_computed(call, error, match):
    """nan, inf, negative and non-numeric arguments raise a typed error naming the argument;
    before, mfu returned nan, 0.0 or a negative utilization and the shapes were accepted."""
    with pytest.raises(error, match=match):
        call()


ANY_NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.booleans(), st.none(), st.text(max_size=2)
)


@given(ANY_NUMBER, ANY_NUMBER, ANY_NUMBER, ANY_NUMBER)
def test_mfu_is_a_finite_fraction_or_a_typed_error(flops, seconds, chips, peak):
    """The probe's fuzz found mfu(-2, 3, 3, 3) = -0.074 and mfu('', 3, 3, 3) raising from '/'."""
    try:
        value = mfu(flops, seconds, chips, peak)
    except (TypeError, ValueError) as e:
        assert "mfu" in str(e) and len(str(e)) < 300
    else:
        assert isinstance(value, float) and math.isfinite(value) and value >= 0


@pytest.mark.parametrize(
    "config, match",
    [
        ({"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 0, "vocab_size": 10, "n_positions": 8},
         "n_head must be a positive int, got 0"),
        ({"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 5, "vocab_size": 10, "n_positions": 8},
         "n_embd = 64 does not split into 5 heads"),
        ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
          "vocab_size": "10", "intermediate_size": 8}, "vocab_size must be a positive int, got '10'"),
        ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
          "vocab_size": 10}, "intermediate_size must be a positive int, got None"),
    ],
)  # fmt: skip
def test_bad_hf_configs_name_the_field(config, match):
    """A config with zero heads raised ZeroDivisionError; a missing field, AttributeError."""
    with pytest.raises(ValueError, match=match):
        TransformerShape.from_hf_config(type("Config", (), config)())


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: mfu(1e12, 0.0, 1, 1e12), MfuError),
        (lambda: mfu(1e12, 1.0, float("-inf"), 1e12), MfuError),
        (lambda: six_n_flops_per_token(float("inf")), MfuError),
        (lambda: six_n_flops_per_token("6"), SpmdTypeError),
        (lambda: TransformerShape(0, 64, 4, 16, 256, 100, 4, False, 1000, 100), MfuError),
        (lambda: TransformerShape(2, 64, 4, 16, 256, 100, 4, "no", 1000, 100), SpmdTypeError),
    ],
)
def test_mfu_arithmetic_refuses_with_our_typed_errors(call, error):
    """Python's own ValueError/TypeError before; our subclasses of them now (issue 36)."""
    with pytest.raises(error):
        call()
