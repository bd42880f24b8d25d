"""`span_attention` (spmd.context._blockwise): tile-by-tile attention of query spans equals
``scaled_dot_product_attention`` of those rows, forward and backward, with causal masks and
grouped-query heads, in float64 to the last bits."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd.context._blockwise import span_attention


def _qkv(b, h, hkv, s, d, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(True)  # noqa: E731
    return make(b, h, s, d), make(b, hkv, s, d), make(b, hkv, s, d)


@settings(deadline=None, max_examples=25)
@given(
    tiles=st.booleans(),  # the tiles of any device, or the CPU's flash kernel
    causal=st.booleans(),
    groups=st.sampled_from([1, 2, 4]),
    seq=st.integers(4, 40),
    block=st.integers(1, 17),
    data=st.data(),
)
def test_spans_attend_as_the_whole_sequence_does(tiles, causal, groups, seq, block, data):
    q, k, v = _qkv(2, 2 * groups, 2, seq, 8)
    cuts = sorted(data.draw(st.lists(st.integers(0, seq), min_size=2, max_size=4, unique=True)))
    spans = tuple(zip(cuts[:-1:2], cuts[1::2]))
    rows = torch.cat([torch.arange(a, b) for a, b in spans]) if spans else torch.arange(0)
    if rows.numel() == 0:
        return
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)[:, :, rows]
    out = span_attention(q[:, :, rows], k, v, spans, causal=causal, scale=8**-0.5, block=block, tiles=tiles)
    assert torch.allclose(out, reference, rtol=0, atol=1e-12)
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    expected = torch.autograd.grad((reference * upstream).sum(), (q, k, v))
    got = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    for e, g in zip(expected, got):
        assert torch.allclose(g, e, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tiles", [True, False])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_low_precision_inputs_accumulate_in_float32(dtype, tolerance, tiles):
    q, k, v = _qkv(1, 4, 1, 64, 16, dtype)
    reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)
    out = span_attention(q, k, v, ((0, 64),), causal=True, scale=0.25, block=16, tiles=tiles)
    assert out.dtype == dtype
    assert (out.double() - reference).abs().max() < tolerance
