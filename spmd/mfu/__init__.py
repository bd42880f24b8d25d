"""Model FLOPs utilization: FLOP counts of transformer training (three formulas), peak FLOP/s
per chip, and the MFU arithmetic the PyTorch/XLA blogs and MaxText use."""

import math

from mesh.checks import require_real
from spmd.errors import MfuError, SpmdTypeError
from spmd.mfu.flops import TransformerShape, matmul_flops_per_token, palm_flops_per_token, six_n_flops_per_token
from spmd.mfu.peak import CHIPS, Chip, chip_for_device_kind, measure_cpu_peak_flops


def mfu(flops_per_step: float, step_seconds: float, chips: float, peak_flops_per_chip: float) -> float:
    """``flops_per_step / step_seconds / chips / peak_flops_per_chip`` (a fraction, not %).

    Raises:
        SpmdTypeError: an argument that is not a real number.
        MfuError: a negative or non-finite FLOP count, a non-positive or non-finite time,
            chip count or peak.
    """
    flops = require_real(flops_per_step, "mfu: flops_per_step", SpmdTypeError, minimum=0, range_error=MfuError)
    seconds = require_real(step_seconds, "mfu: step_seconds", SpmdTypeError, positive=True, range_error=MfuError)
    n_chips = require_real(chips, "mfu: chips", SpmdTypeError, positive=True, range_error=MfuError)
    peak = require_real(
        peak_flops_per_chip, "mfu: peak_flops_per_chip", SpmdTypeError, positive=True, range_error=MfuError
    )
    utilization = flops / seconds / n_chips / peak
    if not math.isfinite(utilization):
        raise MfuError(
            f"mfu overflowed: {flops_per_step!r} FLOPs / {step_seconds!r} s / {chips!r} chips / {peak_flops_per_chip!r}."
        )
    return utilization


__all__ = [
    "CHIPS",
    "Chip",
    "TransformerShape",
    "chip_for_device_kind",
    "matmul_flops_per_token",
    "measure_cpu_peak_flops",
    "mfu",
    "palm_flops_per_token",
    "six_n_flops_per_token",
]
