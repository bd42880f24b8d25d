"""Context parallelism on torch_xla (GSPMD, one process, 8 virtual CPU devices): the global
sequence in the shard order, queries split over the context axis and keys/values whole along it
by annotation; attention and gradients equal the whole sequence's, and the compiled step gathers
keys and values over the context axis."""

import pytest
import torch
import torch.nn.functional as F

import spmd
from mesh import ParallelDims


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _whole(seq, heads=4, kv_heads=2):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, heads, seq, 8, generator=g)
    k = torch.randn(4, kv_heads, seq, 8, generator=g)
    v = torch.randn(4, kv_heads, seq, 8, generator=g)
    return q, k, v


@pytest.mark.parametrize(
    "dims, load_balance",
    [
        (ParallelDims(fsdp=2, context=4), True),
        (ParallelDims(context=8), True),
        (ParallelDims(fsdp=4, context=2), False),
    ],
)
def test_attention_and_gradients_equal_the_whole_sequence_s(xla, dims, load_balance):
    q, k, v = (t.double().requires_grad_(True) for t in _whole(32))
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    upstream = torch.randn(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = torch.autograd.grad((reference * upstream).sum(), (q, k, v))
    model = Attention()
    cp = spmd.context_parallel(model, dims.mesh(), load_balance=load_balance)
    placed = [cp.shard_batch(t.detach().float().transpose(1, 2)).transpose(1, 2) for t in (q, k, v)]
    leaves = [t.detach().requires_grad_(True) for t in placed]
    out = model(*leaves)
    order = cp.order(32)
    (out * upstream.float()[:, :, order.indices].to(xla)).sum().backward()
    assert (out.cpu().double() - reference[:, :, order.indices]).abs().max() < 1e-5
    for leaf, e in zip(leaves, expected):
        assert (leaf.grad.cpu().double() - e[:, :, order.indices]).abs().max() < 1e-5
    assert torch.allclose(cp.unshard(out.transpose(1, 2)).transpose(1, 2).cpu().double(), reference, atol=1e-5)


def test_the_compiled_step_gathers_keys_and_values_over_the_context_axis_at_their_size(xla):
    """The example's step (fsdp 4 x context 2, one sequence a batch shard) compiled by GSPMD: on
    the context axis each attention gathers K and V once in forward (K as its two rotated
    halves) and reduces their gradients once in backward, at the key/value heads' size. XLA's CPU
    compiler keeps a gradient reduction as an all-reduce (a TPU compile makes it a reduce-scatter,
    `spmd.plan.compile.recompile`)."""
    import importlib.util

    from spmd.inspector import CollectiveKind, capture
    from tests.torchrun import ROOT

    spec = importlib.util.spec_from_file_location("train_long_context", ROOT / "examples" / "train_long_context.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    seq, layers, kv_heads, head_dim = 256, 2, 2, 32
    with capture() as report:
        example.main(["--backend", "torch_xla", "--context", "2", "--steps", "1", "--seq", str(seq), "--batch", "4"])
    (step,) = [g for g in report.graphs if any(c.group_size == 2 for c in g.collectives)]
    kv_bytes = 1 * kv_heads * seq * head_dim * 4  # one row a batch shard, the whole sequence, float32
    per_layer = {}
    for c in (c for c in step.collectives if c.group_size == 2 and ".attn" in c.op_name):
        layer = c.op_name.split(".attn")[0].rsplit("/", 1)[-1]
        per_layer.setdefault(layer, []).append(c)
    assert sorted(per_layer) == [f"layers.{i}" for i in range(layers)]
    for layer, ops in per_layer.items():
        gathers = [c for c in ops if c.kind is CollectiveKind.ALL_GATHER]
        assert sum(sum(a.nbytes for a in c.arrays) for c in gathers) == 2 * kv_bytes, layer  # K and V, whole
    # No block gathers its activations along the sequence: linear layers run as einsums over
    # [rows, seq] (flattened, GSPMD gathered the sequence for each, forward and for dW), and the
    # loss keeps its tokens [rows, seq]. Left outside attention: the embedding's ids and, in
    # backward, its gradient (torch_xla's embedding backward flattens them), once a step.
    others = [
        c
        for c in step.collectives
        if c.group_size == 2 and c.kind is CollectiveKind.ALL_GATHER and ".attn" not in c.op_name
    ]
    assert not [c.op_name for c in others if "layers." in c.op_name or "lm_head" in c.op_name]
    assert len(others) <= 2, [(c.op_name, c.arrays) for c in others]
    reductions = [c for c in step.collectives if c.group_size == 2 and c.op_type == "xla__einsum_backward"]
    assert len(reductions) == 2 * layers  # dK and dV of each layer
    assert all(c.kind is CollectiveKind.ALL_REDUCE and c.result_bytes == kv_bytes for c in reductions)
