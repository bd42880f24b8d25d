import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spmd import HloSharding, ShardingKind


@pytest.mark.parametrize(
    "text",
    [
        "{replicated}",
        "{maximal device=3}",
        "{devices=[4,2]0,1,2,3,4,5,6,7}",
        "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}",
    ],
)
def test_text_roundtrip(text):
    assert str(HloSharding.parse(text)) == text


def test_iota_forms_expand():
    assert HloSharding.parse("{devices=[2,4]<=[8]}") == HloSharding.parse("{devices=[2,4]0,1,2,3,4,5,6,7}")
    assert str(HloSharding.parse("{devices=[2,4]<=[4,2]T(1,0)}")) == "{devices=[2,4]0,2,4,6,1,3,5,7}"
    s = HloSharding.parse("{devices=[2,2,2]<=[2,2,2]T(0,2,1) last_tile_dim_replicate}")
    assert str(s) == "{devices=[2,2,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}"


def test_replication_groups_are_sorted():
    a = HloSharding.parse("{devices=[2,2]3,1,2,0 last_tile_dim_replicate}")
    assert str(a) == "{devices=[2,2]1,3,0,2 last_tile_dim_replicate}"


def test_map_devices():
    s = HloSharding.parse("{devices=[2,1,2]<=[4] last_tile_dim_replicate}").map_devices([7, 5, 6, 4])
    assert str(s) == "{devices=[2,1,2]5,7,4,6 last_tile_dim_replicate}"
    assert HloSharding.maximal(1).map_devices([9, 8]) == HloSharding.maximal(8)


def test_bad_text_and_bad_values():
    with pytest.raises(ValueError, match="Not an HLO sharding"):
        HloSharding.parse("{manual device=3}")
    manual = HloSharding.parse("{manual}")
    assert manual == HloSharding.manual() and str(manual) == "{manual}"
    with pytest.raises(ValueError, match="no global layout"):
        manual.shard_bounds((4,), [0])
    with pytest.raises(ValueError, match="needs 8 devices"):
        HloSharding(ShardingKind.TILED, (4, 2), (0, 1, 2))


def test_shard_bounds_uneven_padding():
    s = HloSharding.parse("{devices=[4,1]0,1,2,3}")
    b = s.shard_bounds((10, 3), [0, 1, 2, 3])
    assert [x.index[0] for x in b] == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
    assert [x.padding for x in b] == [(0, 0), (0, 0), (0, 0), (2, 0)]
    assert all(x.padded_shape == (3, 3) for x in b)
    # 2 elements over 4 devices: the last two blocks are empty (all padding).
    b = s.shard_bounds((2, 3), [0, 1, 2, 3])
    assert [x.shape[0] for x in b] == [1, 1, 0, 0]


@given(
    n=st.integers(1, 40),
    m=st.integers(1, 40),
    tiles=st.sampled_from([(1, 8), (8, 1), (2, 4), (4, 2)]),
    seed=st.integers(0, 1000),
)
def test_shard_bounds_cover_array_exactly_once(n, m, tiles, seed):
    perm = np.random.default_rng(seed).permutation(8)
    s = HloSharding.tiled(perm.reshape(tiles))
    seen = np.zeros((n, m), dtype=int)
    for b in s.shard_bounds((n, m), list(range(8))):
        seen[b.index] += 1
        assert all(p >= 0 for p in b.padding)
    assert (seen == 1).all()


def test_shard_bounds_are_exact_past_float_precision():
    n = 2**60 + 3  # float division would round this
    (first, last) = HloSharding.parse("{devices=[2]0,1}").shard_bounds((n,), [0, 1])
    assert first.index[0] == slice(0, 2**59 + 2) and last.index[0] == slice(2**59 + 2, n)
