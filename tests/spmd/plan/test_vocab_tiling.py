"""Vocabulary tiling (`spmd.plan.request.vocab_tiling`): with the loss in chunks, the compiled step holds
no ``[tokens, vocab]`` fp32 buffer; without, it does (so the check can fail). The compiles run
in a process of their own (libtpu and torchax stay out of the test session); the errors need none."""

import math

import pytest
import torch

from spmd.plan import PlanError
from spmd.plan.request.settings import PlanSettings
from spmd.plan.request.vocab_tiling import check_vocab_tiles, output_head, tiled_token_loss
from tests.background import BackgroundRun
from tests.spmd.plan.child_compile import on_demand_on_torch_xla, python_code

# No dim of this Llama is another's: a buffer with a 1024 dim is the vocabulary's.
LLAMA = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1024, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # fmt: skip
BATCH, SEQ, DEVICES, TILES = 8, 512, 4, 4  # v5e:2x2, FSDP over 4: 2 sequences, 1024 tokens a device

COMPILE = """
import json, re, sys
from spmd.plan.api import _lower, _request
from spmd.plan.compile.step import compile_step
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings

config, tiles = sys.argv[1], int(sys.argv[2])
settings = PlanSettings("v5e:2x2", 1, 512, "bfloat16", "flash", None, "float32", tiles)
module, hf_config = build_meta_model(config)
lowered, _, _ = _lower(_request(settings, "fsdp", None, 8, "dots", 4), module, hf_config, 512, None)
hlo = compile_step(lowered.lowered).hlo_text
print(json.dumps(sorted(set(re.findall(r"f32\\[[\\d,]+\\]", hlo)))))
"""


UNTILED, TILED = (python_code(COMPILE, LLAMA, str(tiles), timeout=1200) for tiles in (1, TILES))


def f32_vocab_buffers(run: BackgroundRun) -> list[tuple[int, ...]]:
    """Every fp32 shape with a vocabulary dim in the optimized HLO of ``run``'s step."""
    shapes = [tuple(int(d) for d in s[4:-1].split(",")) for s in run.result()]
    return [s for s in shapes if LLAMA["vocab_size"] in s]


@pytest.mark.reads(UNTILED, TILED)
@on_demand_on_torch_xla
def test_no_tokens_by_vocab_fp32_buffer_with_tiling_on():
    tokens = BATCH * SEQ // DEVICES
    whole = tokens * LLAMA["vocab_size"]
    untiled = f32_vocab_buffers(UNTILED)
    assert max(math.prod(s) for s in untiled) >= whole, untiled  # the model's own loss holds them
    tiled = f32_vocab_buffers(TILED)
    assert tiled, "the head's fp32 master weight and gradient have a vocabulary dim"
    assert max(math.prod(s) for s in tiled) <= whole // TILES, tiled


def test_the_tiled_loss_is_the_cross_entropy():
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    h = jax.random.normal(key, (2, 12, 8), jnp.float32)
    w = jax.random.normal(jax.random.PRNGKey(1), (40, 8), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(2), (40,), jnp.float32)
    t = jax.random.randint(jax.random.PRNGKey(3), (2, 12), 0, 40)

    def whole(h, w, b):
        x = h @ w.T + b
        return jnp.mean(jax.nn.logsumexp(x, -1) - jnp.take_along_axis(x, t[..., None], -1)[..., 0])

    for tiles in (1, 3, 4, 12):
        got = jax.value_and_grad(lambda h, w, b, n=tiles: tiled_token_loss(h, w, b, t, n), argnums=(0, 1, 2))(h, w, b)
        want = jax.value_and_grad(whole, argnums=(0, 1, 2))(h, w, b)
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert jnp.allclose(g, e, rtol=1e-5, atol=1e-6), tiles


@pytest.mark.parametrize(
    ("tiles", "seq", "says"),
    [(0, None, "whole number from 1"), (True, None, "whole number"), (3, 512, "does not divide the sequence")],
)
def test_bad_tile_counts_are_refused(tiles, seq, says):
    with pytest.raises(PlanError, match=says):
        check_vocab_tiles(tiles, seq)
    with pytest.raises(PlanError, match=says):
        PlanSettings("v5e:2x2", seq_len=seq, vocab_tiles=tiles)


def test_a_model_without_a_linear_head_is_refused():
    class Logits(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(PlanError, match="get_output_embeddings"):
        output_head(Logits())


def test_a_tied_head_is_found_under_the_embedding_s_name():
    from spmd.plan.request.models import build_meta_model

    module, _ = build_meta_model("gpt2")
    head = output_head(module)
    assert (head.module, head.weight, head.bias) == ("lm_head", "transformer.wte.weight", None)


def test_a_recipe_s_vocab_tiles_reach_the_plan_the_benchmark_compiles():
    import dataclasses
    import importlib.util

    from spmd.plan.predict.published import published_run
    from tests.torchrun import ROOT

    spec = importlib.util.spec_from_file_location("plan_prediction", ROOT / "benchmarks" / "plan_prediction.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tiled = published_run("llama3.1-70b@tpu7x-512")  # the 128k recipe: num_vocab_tiling=4
    run = published_run("llama3.1-70b@tpu7x-128")  # the 8k one does not tile
    assert bench._candidate(tiled)[1].plan.vocab_tiles == 4
    assert bench._candidate(run)[1].plan.vocab_tiles == 1
    assert (
        bench._candidate(dataclasses.replace(run, recipe=dataclasses.replace(run.recipe, vocab_tiles=2)))[
            1
        ].plan.vocab_tiles
        == 2
    )
    assert "vocab_tiles" in bench._candidate(tiled)[1].plan.cache_key()
    assert "vocab_tiles" not in bench._candidate(run)[1].plan.cache_key()  # untiled plans keep their cache entries
