"""Deferred init into shards (fsdp_xla._shard_init): a random fill drawn a slab of rows at a time
gives every rank's block exactly the values one fill of the whole tensor gives, and leaves the
generator where the whole fill does; the slabs keep the alignment that makes this so."""

import math

import pytest
import torch

from fsdp_xla._shard_init import _replay, record_init, slab_rows, stream_fill

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


def recorded(module, init):
    names = [name for name, _ in module.named_parameters()]
    return record_init([getattr(module, n) for n in names], [[(module, n)] for n in names], lambda: init(module))


def test_an_init_with_a_zeroed_padding_row_is_replayed_on_every_block():
    emb = torch.nn.Embedding(10, 4, padding_idx=5, device="meta")

    def init(m):
        torch.nn.init.normal_(m.weight, std=0.02)
        m.weight[m.padding_idx].zero_()  # a view of the parameter, as transformers' _init_weights does
        m.weight.mul_(2.0)

    recorder = recorded(emb, init)
    assert recorder.unsupported is None
    assert [op.view is None for op in recorder.ops] == [True, False, True]
    torch.manual_seed(0)
    whole = torch.empty(10, 4)
    with torch.no_grad():
        init(torch.nn.Embedding.from_pretrained(whole, freeze=False, padding_idx=5))
    for dim in (0, 1):
        for offset, local_shape in blocks((10, 4), 4, dim):
            torch.manual_seed(0)
            local = torch.full(local_shape, float("nan"))
            for op in recorder.ops:
                _replay(op, (10, 4), local, offset)
            assert torch.equal(
                local, whole[offset[0] : offset[0] + local_shape[0], offset[1] : offset[1] + local_shape[1]]
            )


@pytest.mark.parametrize(
    "init",
    [
        lambda m: m.weight.copy_(torch.ones(3, 4)),  # another tensor's values
        lambda m: torch.nn.init.orthogonal_(m.weight),  # reads the whole parameter (and skips a meta one)
        lambda m: m.weight[0].normal_(),  # a random fill of a view
    ],
    ids=["copy", "orthogonal", "random-view"],
)
def test_an_init_that_cannot_be_replayed_on_shards_is_recognized(init):
    """(A meta stand-in would record nothing for torch 2.15's orthogonal_, which skips meta tensors.)"""
    assert recorded(torch.nn.Linear(4, 3, device="meta"), init).unsupported is not None


def test_trunc_normal_is_never_recorded_as_nothing():
    """torch 2.15's trunc_normal_ returns at once for a meta tensor (the stand-in is none), and
    samples by rejection, reading the values it drew: not replayable, so the unit is built whole.
    torch 2.9's (uniform_, erfinv_, mul_, add_, clamp_) is replayed exactly."""
    lin = torch.nn.Linear(40, 33, bias=False, device="meta")
    log = recorded(lin, lambda m: torch.nn.init.trunc_normal_(m.weight, std=0.02))
    if log.unsupported is not None:
        assert "aten.lt" in log.unsupported or "aten.gt" in log.unsupported, log.unsupported
        return
    assert len(log.ops) >= 2
    torch.manual_seed(0)
    whole = torch.nn.init.trunc_normal_(torch.empty(33, 40), std=0.02)
    for offset, local_shape in blocks((33, 40), 4, 0):
        torch.manual_seed(0)
        local = torch.full(local_shape, float("nan"))
        for op in log.ops:
            _replay(op, (33, 40), local, offset)
        assert torch.equal(local, whole[offset[0] : offset[0] + local_shape[0]])
