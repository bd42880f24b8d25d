"""Deferred init into shards (fsdp_xla._shard_init): a random fill drawn a slab of rows at a time
gives every rank's block exactly the values one fill of the whole tensor gives, and leaves the
generator where the whole fill does; the slabs keep the alignment that makes this so."""

import math

import pytest
import torch

from fsdp_xla._shard_init import slab_rows, stream_fill

SHAPES = [(509, 128), (512, 33), (64, 1), (7,), (15,), (16,), (17,), (33,), (1000, 3), (5, 3, 7), (1, 40), ()]
FILLS = {
    "normal": lambda buf: buf.normal_(0.0, 0.02),
    "uniform": lambda buf: buf.uniform_(-0.1, 0.1),
}


def blocks(shape, ways, dim):
    """torch.chunk-style blocks of ``shape`` on ``dim``: (offset, local shape) per rank."""
    if not shape:
        return [((), ())]
    size = -(-shape[dim] // ways)
    out = []
    for r in range(ways):
        lo, hi = min(r * size, shape[dim]), min((r + 1) * size, shape[dim])
        offset = tuple(lo if d == dim else 0 for d in range(len(shape)))
        local = tuple(hi - lo if d == dim else n for d, n in enumerate(shape))
        out.append((offset, local))
    return out


@pytest.mark.parametrize("fill", sorted(FILLS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("target", [16, 100])
def test_a_fill_in_slabs_gives_each_block_the_whole_fills_values(fill, shape, dim, target):
    if dim >= max(len(shape), 1):
        pytest.skip("no such dim")
    torch.manual_seed(3)
    whole = torch.empty(shape)
    FILLS[fill](whole)
    after_whole = torch.rand(4)
    for offset, local_shape in blocks(shape, 4, dim):
        torch.manual_seed(3)
        local = torch.full(local_shape, float("nan"))
        stream_fill(FILLS[fill], shape, torch.float32, local, offset, target)
        expected = whole
        for d, (o, n) in enumerate(zip(offset, local_shape)):
            expected = expected.narrow(d, o, n)
        assert torch.equal(local, expected), (shape, offset)
        assert torch.equal(torch.rand(4), after_whole)  # the generator moved on as the whole fill moves it


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("target", [1, 16, 50, 4096])
def test_slabs_cover_the_rows_in_16_element_aligned_pieces(shape, target):
    ranges = slab_rows(shape, target)
    rows = shape[0] if shape else 1
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(a < b and b == c for (a, b), (c, _) in zip(ranges, ranges[1:]))
    per_row = math.prod(shape) // max(rows, 1)
    *inner, (a, b) = ranges
    assert all((hi - lo) * per_row % 16 == 0 for lo, hi in inner)
    assert len(ranges) == 1 or (b - a) * per_row >= 16
