"""Peak dense bf16 FLOP/s per chip, chip detection, and a measured peak for the CPU.

Published figures (bf16, dense, per chip; ../shared/anchors.md in the project's reference):

- TPU v2 45 TFLOP/s (180 per 4-chip board, Cloud TPU release notes), v3 123 (cloud.google.com/tpu/docs/v3),
  v4 275 (/v4), v5e 197 (/v5e), v5p 459 (/v5p), v6e 918 (/v6e), 7x 2307 (/tpu7x);
- NVIDIA A100 312, H100 SXM 989 (1979 is with sparsity), H200 989 (datasheets).

XLA reports TPUs by ``device_kind`` (the strings JAX and ``xm.xla_device_kind()`` give): v5e is
"TPU v5 lite", v5p is "TPU v5", v6e is "TPU v6 lite", 7x is "TPU7x". On v2, v3 and 7x each
chip shows up as two devices; MFU divides by chips.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mesh.checks import require_int, require_real, require_str
from spmd.errors import MfuError, SpmdTypeError

__all__ = ["Chip", "CHIPS", "chip_for_device_kind", "measure_cpu_peak_flops"]


@dataclass(frozen=True)
class Chip:
    """An accelerator: its peak dense bf16 FLOP/s per chip and devices per chip."""

    name: str
    peak_flops: float
    devices_per_chip: int = 1

    def __post_init__(self) -> None:
        require_str(self.name, "Chip.name", SpmdTypeError, nonempty=True)
        require_real(
            self.peak_flops, "Chip.peak_flops (FLOP/s per chip)", SpmdTypeError, positive=True, range_error=MfuError
        )
        require_int(self.devices_per_chip, "Chip.devices_per_chip", SpmdTypeError, minimum=1, range_error=MfuError)


CHIPS: dict[str, Chip] = {
    "v2": Chip("TPU v2", 45e12, 2),
    "v3": Chip("TPU v3", 123e12, 2),
    "v4": Chip("TPU v4", 275e12),
    "v5e": Chip("TPU v5e", 197e12),
    "v5p": Chip("TPU v5p", 459e12),
    "v6e": Chip("TPU v6e", 918e12),
    "7x": Chip("TPU7x", 2307e12, 2),
    "a100": Chip("A100", 312e12),
    "h100": Chip("H100", 989e12),
    "h200": Chip("H200", 989e12),
}

_DEVICE_KINDS = {
    "tpu v2": "v2",
    "tpu v3": "v3",
    "tpu v4": "v4",
    "tpu v5 lite": "v5e",
    "tpu v5e": "v5e",
    "tpu v5": "v5p",
    "tpu v5p": "v5p",
    "tpu v6 lite": "v6e",
    "tpu v6e": "v6e",
    "tpu7x": "7x",
    "tpu7": "7x",
}


def chip_for_device_kind(device_kind: str) -> Chip:
    """The chip behind an XLA ``device_kind`` string (exact match, case-insensitive), or an
    accelerator name such as ``"a100"``.

    Raises:
        SpmdTypeError: ``device_kind`` is not a string.
        MfuError: an unknown kind (e.g. "TPU v4 lite", the inference v4i); pass --peak-tflops.
    """
    if not isinstance(device_kind, str):
        raise SpmdTypeError(f"device_kind must be a string such as 'TPU v5 lite', got {device_kind!r:.60}.")
    key = device_kind.strip().lower()
    name = _DEVICE_KINDS.get(key, key if key in CHIPS else None)
    if name is None:
        raise MfuError(
            f"No peak FLOP/s known for device kind {device_kind!r}; known: {sorted(_DEVICE_KINDS)} and {sorted(CHIPS)}. "
            "Give the peak yourself (--peak-tflops)."
        )
    return CHIPS[name]


# Two n x n float32 matrices of 16384 are 2 GiB; a larger n would exhaust a host's memory, not measure it.
_MAX_N = 16384
# Each repeat is one n x n matmul; more than this measures nothing the first thousand did not (and
# a huge count would run for ever).
_MAX_REPEATS = 1000


def measure_cpu_peak_flops(n: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of this machine's best dense matmul: the fastest of ``repeats`` ``n x n`` float32
    matmuls in PyTorch on the CPU, all threads (``2 n^3`` FLOPs each).

    Raises:
        SpmdTypeError: ``n`` or ``repeats`` not an int, ``dtype`` not a floating torch dtype.
        MfuError: ``n`` or ``repeats`` below 1, ``n`` above 16384, ``repeats`` above 1000.
    """
    require_int(n, "measure_cpu_peak_flops: n", SpmdTypeError, minimum=1, maximum=_MAX_N, range_error=MfuError)
    require_int(
        repeats, "measure_cpu_peak_flops: repeats", SpmdTypeError, minimum=1, maximum=_MAX_REPEATS, range_error=MfuError
    )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise SpmdTypeError(f"measure_cpu_peak_flops: dtype must be a floating torch.dtype, got {dtype!r:.60}.")
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2.0 * n**3 / best
