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
