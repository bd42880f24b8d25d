import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd import HloSharding, ShardingKind
from spmd.errors import HloShardingError, SpmdTypeError
from spmd.sharding._hlo_sharding import iota_device_ids


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


H22 = "{devices=[2,2]0,1,2,3}"


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: HloSharding("tiled"), TypeError, "kind is a ShardingKind"),
        (
            lambda: HloSharding(ShardingKind.TILED, (-1, -2), (0, 1)),
            ValueError,
            r"each >= 1 block; got tile_shape \(-1, -2\)",
        ),
        (lambda: HloSharding(ShardingKind.TILED, (), (), 0), ValueError, "1 to 63 tile dims"),
        (lambda: HloSharding(ShardingKind.TILED, (2,), (0, 1), 0), ValueError, r"replication counts .* got 0"),
        (lambda: HloSharding(ShardingKind.TILED, (2,), (0, -1)), ValueError, r"got \[-1\]"),
        (lambda: HloSharding(ShardingKind.TILED, (2,), (0, 1.0)), TypeError, "devices is a tuple of ints; 1.0"),
        (lambda: HloSharding(ShardingKind.REPLICATED, (0, 3), (), -1), ValueError, "no tile shape or replication"),
        (lambda: HloSharding(ShardingKind.REPLICATED, (), (-1, 5)), ValueError, "names no devices"),
        (lambda: HloSharding.maximal(1.7), TypeError, "device is an int id, got 1.7"),
        (lambda: HloSharding.maximal(-1), ValueError, r"below 2\*\*31.*got \[-1\]"),
        (lambda: HloSharding.parse("{maximal device=99999999999999999999}"), ValueError, "below 2"),
        (lambda: HloSharding.parse("{devices=[" + "1," * 70 + "1]0}"), ValueError, "has 71 tile dims"),
        (lambda: HloSharding.tiled(np.array([], dtype=int)), ValueError, r"tile_shape \(0,\)"),
        (lambda: HloSharding.tiled(np.array(5)), ValueError, "0-d array"),
        (lambda: HloSharding.tiled(np.array(5), replicate_last_dim=True), ValueError, "0-d array"),
        (lambda: HloSharding.tiled(np.array([1.5])), TypeError, "array of int device ids, got dtype float64"),
        (lambda: HloSharding.tiled(np.arange(2), replicate_last_dim="no"), TypeError, "True or False"),
        (lambda: HloSharding.parse(H22).shard_bounds((-8, 8), [0, 1, 2, 3]), ValueError, r"sizes >= 0, got \(-8, 8\)"),
        (lambda: HloSharding.replicated().shard_bounds((-3,), [0]), ValueError, r"got \(-3,\)"),
        (
            lambda: HloSharding.parse(H22).shard_bounds("ab", [0]),
            TypeError,
            "global_shape is a tuple of ints, got 'ab'",
        ),
        (
            lambda: HloSharding.parse(H22).map_devices([5]),
            ValueError,
            "names devices up to 3, but map_devices got 1 ids",
        ),
        (lambda: HloSharding.maximal(2).map_devices([5]), ValueError, "give at least 3"),
        (lambda: iota_device_ids(None), ValueError, "text such as"),
    ],
)
def test_bad_values_are_refused_with_a_typed_error(call, error, match):
    with pytest.raises(error, match=match) as info:
        call()
    assert isinstance(info.value, (HloShardingError, SpmdTypeError))
    assert len(str(info.value)) < 1000


def test_widest_valid_tilings_still_parse():
    assert len(HloSharding.parse("{devices=[" + "1," * 62 + "1]0}").tile_shape) == 63
    s = HloSharding.parse("{devices=[" + "1," * 63 + "1]0 last_tile_dim_replicate}")
    assert len(s.tile_shape) == 63 and s.replication == 1
    assert HloSharding.maximal(np.int64(3)) == HloSharding.maximal(3)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    kind=st.sampled_from(list(ShardingKind)),
    tile=st.lists(st.integers(-2, 4), max_size=3),
    devices=st.lists(st.integers(-2, 9), max_size=8),
    replication=st.integers(-1, 3),
    shape=st.lists(st.integers(-2, 9), max_size=3),
    query=st.lists(st.integers(-1, 9), max_size=4),
)
def test_any_values_give_a_valid_sharding_or_a_typed_error(kind, tile, devices, replication, shape, query):
    """The probe's fuzz target: 6 classes of bad values were accepted before (negative ids and
    tile sizes, empty tilings, negative shapes)."""
    try:
        h = HloSharding(kind, tuple(tile), tuple(devices), replication)
        bounds = h.shard_bounds(tuple(shape), query)
    except (HloShardingError, SpmdTypeError) as e:
        assert 15 < len(str(e)) < 1000
        return
    assert all(0 <= d < 2**31 for d in h.devices) and all(n >= 0 for n in shape)
    assert h.kind is not ShardingKind.TILED or (h.tile_shape and min(h.tile_shape) >= 1 and h.devices)
    assert HloSharding.parse(str(h)) == h
    for b in bounds:
        assert all(0 <= s.start <= s.stop <= n for s, n in zip(b.index, shape))
