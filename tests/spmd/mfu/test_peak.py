"""Peak FLOP/s per chip from XLA device kinds, and the CPU's measured peak."""

import pytest
import torch

from spmd.errors import MfuError, SpmdTypeError
from spmd.mfu import CHIPS, Chip, chip_for_device_kind, measure_cpu_peak_flops


@pytest.mark.parametrize(
    "kind, name, tflops, devices",
    [
        ("TPU v2", "TPU v2", 45, 2),
        ("TPU v3", "TPU v3", 123, 2),
        ("TPU v4", "TPU v4", 275, 1),
        ("TPU v5 lite", "TPU v5e", 197, 1),
        ("TPU v5", "TPU v5p", 459, 1),
        ("TPU v6 lite", "TPU v6e", 918, 1),
        ("TPU7x", "TPU7x", 2307, 2),
        ("a100", "A100", 312, 1),
        ("H100", "H100", 989, 1),
    ],
)
def test_device_kinds(kind, name, tflops, devices):
    chip = chip_for_device_kind(kind)
    assert (chip.name, chip.peak_flops, chip.devices_per_chip) == (name, tflops * 1e12, devices)


def test_unknown_kinds_ask_for_the_peak():
    with pytest.raises(ValueError, match=r"'TPU v4 lite'.*--peak-tflops"):
        chip_for_device_kind("TPU v4 lite")
    assert set(CHIPS) >= {"v2", "v3", "v4", "v5e", "v5p", "v6e", "7x", "a100", "h100", "h200"}


def test_cpu_peak_is_measured():
    peak = measure_cpu_peak_flops(n=256, repeats=2)
    assert 1e8 < peak < 1e14


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: chip_for_device_kind(None), TypeError, "device_kind must be a string"),
        (lambda: measure_cpu_peak_flops(n=0), ValueError, "n must be an int from 1 to 16384, got 0"),
        (lambda: measure_cpu_peak_flops(n=-1), ValueError, "n must be an int from 1 to 16384, got -1"),
        (lambda: measure_cpu_peak_flops(n=10**6), ValueError, "n must be an int from 1 to 16384"),
        (lambda: measure_cpu_peak_flops(n=16, repeats=0), ValueError, "repeats must be an int from 1 to 1000, got 0"),
        (lambda: measure_cpu_peak_flops(n=16, dtype=torch.int32), TypeError, "floating torch.dtype"),
    ],
)
def test_bad_arguments_are_refused(call, error, match):
    """n=0 and repeats=0 measured 0.0 FLOP/s; n=-1 raised from inside torch; None from str.strip."""
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: measure_cpu_peak_flops(n=16, repeats=2**70), MfuError, "repeats must be an int from 1 to 1000"),
        (lambda: chip_for_device_kind("TPU v99"), MfuError, "No peak FLOP/s known for device kind 'TPU v99'"),
        (lambda: Chip("x", float("nan")), MfuError, r"Chip.peak_flops \(FLOP/s per chip\) must be finite and > 0"),
        (lambda: Chip("x", 0.0), MfuError, "must be finite and > 0, got 0.0"),
        (lambda: Chip("x", "1e12"), SpmdTypeError, "Chip.peak_flops .* must be a real number, got '1e12'"),
        (lambda: Chip("x", 1e12, 0), MfuError, "Chip.devices_per_chip must be an int >= 1, got 0"),
        (lambda: Chip("x", 1e12, True), SpmdTypeError, "Chip.devices_per_chip must be an int >= 1, got True"),
        (lambda: Chip("", 1e12), SpmdTypeError, "Chip.name must be a non-empty string"),
        (lambda: Chip(None, 1e12), SpmdTypeError, "Chip.name must be a non-empty string"),
    ],
)
def test_mfu_refusals_are_our_typed_errors(call, error, match):
    """spmd.mfu raised Python's own ValueError (an unknown chip, a zero time) and built a Chip of
    any values (a NaN peak gave a NaN MFU); a huge repeats ran for ever. Now MfuError (a
    ValueError) and SpmdTypeError (a TypeError), checked when the value is given."""
    with pytest.raises(error, match=match):
        call()
