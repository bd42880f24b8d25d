"""Slice names to libtpu topologies and chip figures (pure)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spmd.plan import CHIP_SPECS, TopologyError, parse_slice


@pytest.mark.parametrize(
    ("name", "chips", "libtpu"),
    [
        ("v5p-128", 64, "v5p:4x4x4"),  # v5p names count cores, two per chip
        ("v5p-256", 128, "v5p:4x4x8"),
        ("v5p-8", 4, "v5p:2x2x1"),
        ("v4-128", 64, "v4:4x4x4"),
        ("v5e-256", 256, "v5e:16x16"),  # v5e and v6e names count chips
        ("v5litepod-16", 16, "v5e:4x4"),
        ("v5e-128", 128, "v5e:8x16"),
        ("v6e-64", 64, "v6e:8x8"),
        ("v5p:4x4x8", 128, "v5p:4x4x8"),
        ("v5e:2x2", 4, "v5e:2x2"),
        ("tpu7x-8", 4, "tpu7x:2x2x1"),  # TPU7x names count TensorCores, two per chip
        ("tpu7x-128", 64, "tpu7x:4x4x4"),
        ("tpu7x-512", 256, "tpu7x:4x8x8"),
        ("tpu7x:2x2x1", 4, "tpu7x:2x2x1"),
        ("tpu7x:4x4x4", 64, "tpu7x:4x4x4"),
    ],
)
def test_slice_names(name, chips, libtpu):
    target = parse_slice(name)
    assert (target.chips, target.libtpu_topology) == (chips, libtpu)
    assert target.devices == chips * (2 if name.startswith("tpu7x") else 1)


def test_ironwood_devices_are_half_a_chip():
    chip = CHIP_SPECS["tpu7x"]
    assert (chip.devices_per_chip, chip.hbm_bytes, chip.device_hbm_bytes) == (2, 192 * 2**30, 96 * 2**30)
    assert chip.device_peak_flops == 2307e12 / 2
    assert parse_slice("tpu7x-128").devices_per_slice == 128


def test_slices_multiply_chips():
    target = parse_slice("v5e-256", slices=2)
    assert (target.chips_per_slice, target.chips, target.slices) == (256, 512, 2)


@given(st.integers(min_value=2, max_value=14), st.sampled_from(["v5p", "v5e", "v6e", "v4", "tpu7x"]))
def test_default_shapes_hold_every_chip(exp, gen):
    count = 2**exp
    try:
        target = parse_slice(f"{gen}-{count}")
    except TopologyError:
        assert CHIP_SPECS[gen].names_count_cores and count < 8  # fewer than 4 chips
        return
    chips = count // 2 if CHIP_SPECS[gen].names_count_cores else count
    assert target.chips == chips
    if chips > 8:  # the smallest 3-D slices are 2x2x1 and 2x2x2
        assert list(target.shape) == sorted(target.shape)
        assert max(target.shape) <= 2 * min(target.shape)


@pytest.mark.parametrize(
    ("name", "slices", "says"),
    [
        ("v5p-128x", 1, "Unknown TPU slice"),
        ("v7-64", 1, "Unknown TPU slice"),
        ("v5e-96", 1, "not a power of two"),
        ("v5p-2", 1, "smallest 3-D slice"),
        ("v5p:4x4", 1, "3-D shape"),
        ("v5e-16", 0, "positive int"),
        ("v5e:99999x99999", 1, "'v5e:99999x99999' has 9999800001 chips; no TPU slice has more than 16384"),
        ("v5e-524288", 1, "has 524288 chips; no TPU slice has more than 16384"),
        ("v5e-4", 512, r"slices=512: libtpu's compiler takes at most 511 slices \(at 512 it aborts the process\)"),
        ("v5p:16x16x16", 64, r"64 slices of 'v5p:16x16x16' are 262144 chips, more than 131072"),
        ("v5e-4", 144044961, r"slices=144044961: libtpu's compiler takes at most 511"),
    ],
)
def test_bad_slices_say_what_to_write(name, slices, says):
    with pytest.raises(TopologyError, match=says):
        parse_slice(name, slices)


def test_chip_table_is_the_published_figures():
    # cloud.google.com/tpu/docs/<chip>, as in ../shared/anchors.md
    peaks = {k: c.peak_flops / 1e12 for k, c in CHIP_SPECS.items()}
    assert peaks == {"v4": 275, "v5e": 197, "v5p": 459, "v6e": 918, "tpu7x": 2307}
