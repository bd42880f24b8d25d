"""The step-time model's calibration: what it cannot derive from the program and the chip's
figures, in one place (`spmd.plan._step_time`; docs/plan.md, "Calibration")."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CALIBRATION", "Calibration"]


@dataclass(frozen=True)
class Calibration:
    """What the step-time model cannot derive from the program and the chip's figures.

    Attributes:
        matmul_efficiency: the share of the chip's peak a large matmul whose dims fill the matrix
            unit reaches (smaller or ragged dims lose more, by the padding they need).
        attention_efficiency: the same for a splash attention kernel's matmuls.
        ring_step_seconds: the latency of one step of a ring collective (a hop and a sync).
        host_bytes_per_second: device <-> host memory transfers, per chip (host offload).
    """

    matmul_efficiency: float
    attention_efficiency: float
    ring_step_seconds: float
    host_bytes_per_second: float


# Fitted on the two runs docs/plan.md names and on nothing else: tpu-recipes training/ironwood
# Llama 3.1-70B 8k bf16 on 64 chips (1,207 TFLOP/s/chip) and Llama 3.1-405B 8k bf16 on 256 chips
# (1,261 TFLOP/s/chip), planned with their recipes' shapes (docs/plan.md, "Calibration").
# matmul_efficiency and attention_efficiency are one value (two runs cannot tell them apart):
# 0.765 makes the larger of the two errors smallest (-3.8 % and +4.1 %). Not fitted, set before
# looking: ring_step_seconds, a 1 us ICI hop (0 moves the two predictions by +1.3 and +1.2 points,
# 10 us by -11 and -11); host_bytes_per_second, PCIe Gen5 x16's 64 GB/s per host shared by its 4
# chips (the runs' host transfers are hidden: a quarter of it changes neither prediction).
CALIBRATION = Calibration(
    matmul_efficiency=0.765,
    attention_efficiency=0.765,
    ring_step_seconds=1e-6,
    host_bytes_per_second=16e9,
)
