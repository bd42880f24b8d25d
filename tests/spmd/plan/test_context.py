"""Context parallelism in the planner (`spmd.plan.request.context`), with no TPU compile: the load-balanced
order is MaxText's, the sharded attention equals unsharded causal attention (JAX on this session's
virtual CPU devices, the splash kernel in Pallas' interpreter), the model FLOPs at 131,072 tokens
are MaxText's count, and bad requests are refused before anything compiles. The compiled plans
are in test_plan_context.py."""

import numpy as np
import pytest

from spmd.plan import PlanError, advise, plan
from spmd.plan.advisor.advisor import candidates_for
from spmd.plan.predict.estimate import model_flops
from spmd.plan.predict.memory import model_shape, plan_memory
from spmd.plan.predict.published import published_run
from spmd.plan.request.attention import Attention
from spmd.plan.request.context import (
    axes_spanned,
    check_context,
    check_no_sliding_window,
    load_balanced_order,
    to_contiguous,
)
from spmd.plan.request.models import BUILTIN_CONFIGS, _hf_config, build_meta_model
from spmd.plan.request.remat import Remat
from spmd.plan.request.topology import parse_slice


def test_the_order_is_maxtexts_dual_chunk_swap():
    # MaxText max_utils.reorder_sequence's docstring: cp 2, [0 1 2 3 4 5 6 7] -> [0 1 6 7 2 3 4 5]
    assert load_balanced_order(8, 2).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    # ... and reorder_causal_load_balanced's: 4 shards of 16 -> [0 1 14 15], [4 5 10 11] ... (chunks of 2)
    shards = load_balanced_order(16, 4).reshape(4, 4).tolist()
    assert shards == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    # each shard holds the same causal work: its positions sum to the same
    assert len({sum(s) for s in shards}) == 1


def test_to_contiguous_undoes_the_order():
    x = np.arange(2 * 24 * 3).reshape(2, 24, 3)
    order = load_balanced_order(24, 3)
    assert (np.asarray(to_contiguous(x[:, order], 3, axis=1)) == x).all()


def _reference(q, k, v):
    """Causal attention of ``[batch, heads, seq, dim]`` arrays in position order, K/V heads grouped."""
    import jax
    import jax.numpy as jnp

    group = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
    seq = q.shape[2]
    s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -1e30)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def test_load_balanced_attention_over_context_shards_is_causal_attention():
    """The planner's attention (K/V all-gathered over ``context``, the load-balanced mask) on a
    2 x 2 CPU mesh, forward and gradients, against causal attention on the unsplit sequence."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as JaxSpec

    from spmd.plan.request.context import context_attention

    batch, heads, kv_heads, seq, dim, context = 2, 2, 1, 512, 128, 2
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, context), ("fsdp", "context"))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((batch, h, seq, dim)).astype(np.float32) for h in (heads, kv_heads, kv_heads))
    order = load_balanced_order(seq, context)
    sharding = NamedSharding(mesh, JaxSpec("fsdp", None, "context", None))
    args = [jax.device_put(x[:, :, order], sharding) for x in (q, k, v)]  # as the shards hold the sequence

    def attend(q, k, v):
        return context_attention(q, k, v, mesh, ("fsdp",), "context", None, block=256, interpret=True)

    def loss(attention, *qkv):
        return (attention(*qkv) ** 2).sum()

    out = np.asarray(jax.jit(attend)(*args))
    assert np.abs(out - np.asarray(_reference(q, k, v))[:, :, order]).max() < 1e-4
    grads = jax.jit(jax.grad(lambda *a: loss(attend, *a), argnums=(0, 1, 2)))(*args)
    expected = jax.grad(lambda *a: loss(_reference, *a), argnums=(0, 1, 2))(q, k, v)
    for got, want in zip(grads, expected):
        want = np.asarray(want)[:, :, order]
        assert np.abs(np.asarray(got) - want).max() < 1e-5 * np.abs(want).max() * 10
    # the check can fail: causal attention taking the shards' order for positions is another function
    wrong = np.asarray(_reference(*(x[:, :, order] for x in (q, k, v))))
    assert np.abs(wrong - np.asarray(_reference(q, k, v))[:, :, order]).max() > 0.1


def test_a_collective_s_axes_are_read_from_its_group():
    # positions row-major over (fsdp=2, context=4): 0-3 are context shards of one fsdp shard
    assert axes_spanned((0, 1, 2, 3), (2, 4), ("fsdp", "context")) == ("context",)
    assert axes_spanned((0, 4), (2, 4), ("fsdp", "context")) == ("fsdp",)
    assert axes_spanned(tuple(range(8)), (2, 4), ("fsdp", "context")) == ("fsdp", "context")


def test_a_sequence_load_balancing_cannot_split_is_refused_naming_the_fix():
    check_context(131072, 8)
    with pytest.raises(PlanError, match=r"2 x 8 = 16 equal chunks.*--seq 1000.*divisible by 16"):
        check_context(1000, 8)
    with pytest.raises(PlanError, match=r"leaves 192 tokens a shard, not a multiple of 128.*divisible by 256"):
        check_context(384, 2)


TINY = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1024, "max_position_embeddings": 4096,
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import json

    path = tmp_path_factory.mktemp("cp") / "tiny.json"
    path.write_text(json.dumps(TINY))
    return str(path)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        (dict(mesh={"fsdp": 2, "context": 4}, seq_len=512), r"splash attention only.*Add --attention flash"),
        (dict(mesh={"fsdp": 2, "context": 4}, seq_len=1028, attention="flash"), r"--seq 1028 .* divisible by 8"),
        (dict(mesh={"fsdp": 2, "context": 4}, seq_len=640, attention="flash"), r"160 tokens a shard"),
        (dict(mesh={"fsdp": 4, "context": 4}, seq_len=512, attention="flash"), r"has 16 devices; .* has 8 devices"),
        (dict(strategy="cp", seq_len=512, attention="flash"), r"context axis whose size .*--mesh fsdp=N,context=C"),
        (dict(strategy="2d", mesh={"fsdp": 2, "context": 2, "tensor": 2}, seq_len=512, attention="flash"),
         r"strategy 'fsdp' or 'cp'.*not '2d'"),
    ],
)  # fmt: skip
def test_a_context_plan_that_cannot_compile_is_refused_before_compiling(tiny, kwargs, said):
    with pytest.raises(PlanError, match=said):
        plan(tiny, "tpu7x:2x2x1", global_batch=2, **kwargs)


def test_a_sliding_window_model_is_refused_on_a_context_axis(tmp_path, tiny):
    import json

    gemma = {**TINY, "model_type": "gemma3_text", "head_dim": 128, "sliding_window": 128}
    path = tmp_path / "gemma.json"
    path.write_text(json.dumps(gemma))
    with pytest.raises(PlanError, match=r"sliding window of 128 tokens.*drop context from --mesh"):
        plan(str(path), "tpu7x:2x2x1", global_batch=2, mesh={"fsdp": 2, "context": 4}, seq_len=512, attention="flash")
    module, _ = build_meta_model(str(path))
    check_no_sliding_window(module, 128)  # a window holding the sequence is no window
    module, _ = build_meta_model(tiny)
    check_no_sliding_window(module, 512)
    # Mistral's attention modules read the window from the config (`spmd.mfu.flops.sliding_layers`);
    # a stray sliding_window in another model's config is not read as one
    for model_type, refused in (("mistral", True), ("llama", False)):
        path = tmp_path / f"{model_type}.json"
        path.write_text(json.dumps({**TINY, "model_type": model_type, "sliding_window": 128}))
        module, _ = build_meta_model(str(path))
        if refused:
            with pytest.raises(PlanError, match="sliding window of 128 tokens"):
                check_no_sliding_window(module, 512)
        else:
            check_no_sliding_window(module, 512)


def test_the_advisor_tries_context_meshes_and_refuses_them_without_flash(tiny):
    target = parse_slice("tpu7x-512")
    meshes = candidates_for(target, ["cp"], [], 64, contexts=[4, 8, 3])
    assert meshes == [("cp", {"fsdp": 128, "context": 4}), ("cp", {"fsdp": 64, "context": 8})]
    with pytest.raises(PlanError, match=r"Strategy 'cp' .* splash attention only"):
        advise(tiny, "tpu7x:2x2x1", strategies=["cp"], seq_len=512, jobs=1, cache_dir=None)


def test_our_memory_math_splits_activations_over_context():
    config = _hf_config(BUILTIN_CONFIGS["llama3.1-70b"])
    shape = model_shape(config, 70_553_706_496)
    one, eight = (
        plan_memory(shape, Remat.SAVE_QKV_CONTEXT, Attention.FLASH, 131072, 1, 1, 0, 0, context) for context in (1, 8)
    )
    assert one.saved == 8 * eight.saved
    # per token and layer: input, q, k, v and attention's output in bf16, and the fp32 log-sum-exp of 64 heads
    assert eight.saved == 80 * 16384 * ((8192 + 8192 + 1024 + 1024 + 8192) * 2 + 64 * 4)


def test_model_flops_at_131072_tokens_are_maxtexts_count():
    """MaxText's calculate_tflops_training_per_device for Llama 3.1-70B: the weights' matmuls (MLP,
    q/k/v, output projection, unembedding) and causal attention, 4 x batch x seq^2 x heads x head
    dim halved, all x 3 for training. The Ironwood run's 897.94 TFLOP/s a chip at 34.02 s a step on
    256 chips is that count (to the README's rounding)."""
    config = _hf_config(BUILTIN_CONFIGS["llama3.1-70b"])
    per_token, _ = model_flops(config, 70_553_706_496, 131072)
    d, layers, heads, kv, head_dim, mlp, vocab, seq = 8192, 80, 64, 8, 128, 28672, 128256, 131072
    weights = 2 * d * (3 * mlp + (heads + 2 * kv) * head_dim + heads * head_dim) * layers + 2 * d * vocab
    attention = 4 * seq * heads * head_dim / 2 * layers  # per token: 4 x seq^2 / seq, causal half
    assert per_token == pytest.approx(3 * (weights + attention), rel=1e-12)
    run = published_run("llama3.1-70b@tpu7x-512")
    step = per_token * run.recipe.global_batch * run.recipe.seq_len
    assert step / 34.02 / run.chips / 1e12 == pytest.approx(run.tflops_per_chip, rel=0.005)
