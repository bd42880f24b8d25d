"""The step-time model's calibration: what it cannot derive from the program and the chip's
figures, in one place (`spmd.plan.predict._step_time`; docs/plan.md, "Calibration")."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from spmd.plan.request.topology import CHIP_SPECS, ChipSpec

__all__ = [
    "CALIBRATION",
    "CALIBRATION_RUNS",
    "SLICE_CALIBRATION_RUNS",
    "Calibration",
    "CalibrationPoint",
    "SliceScaling",
    "fit_efficiency",
    "fit_efficiency_and_host_link",
    "fit_slice_share",
]


@dataclass(frozen=True)
class Calibration:
    """What the step-time model cannot derive from the program and the chip's figures.

    Attributes:
        matmul_efficiency: the share of the chip's peak a large matmul whose dims fill the matrix
            unit reaches (smaller or ragged dims lose more, by the padding they need).
        attention_efficiency: the same for a splash attention kernel's matmuls.
        ring_step_seconds: the latency of one step of a ring collective (a hop and a sync).
        chip_efficiency: ``(chip, efficiency)`` pairs (`ChipSpec.libtpu_name`: ``v5e``,
            ``tpu7x``) for generations fitted on their own, matmuls and attention alike. A chip
            with no pair takes the first fitted generation's whose matrix unit has its side
            (`ChipSpec.mxu`: v4 and v5p v5e's); the two values above serve a chip with
            neither.
        slice_doubling_share: how much longer a step runs each time the slices it spans double:
            a step on ``n`` slices takes ``1 + slice_doubling_share * log2(n)`` times what its
            compiled program predicts (`slice_factor`). The program does not show it: libtpu's
            schedule hides its DCN sends, and what the published runs lose on more slices (the
            slices' waits for each other, their traffic sharing the data-center network) is not
            measured here, only fitted (`SLICE_CALIBRATION_RUNS`).
        chip_host_link: ``(chip, bytes/s each way)`` pairs for generations whose host link is
            fitted on their own offloading runs, with their efficiency; a chip with no pair takes
            its own figure (`ChipSpec.host_bytes_per_second`, the JAX scaling book's).
    """

    matmul_efficiency: float
    attention_efficiency: float
    ring_step_seconds: float
    chip_efficiency: tuple[tuple[str, float], ...] = ()
    slice_doubling_share: float = 0.0
    chip_host_link: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.slice_doubling_share < 1.0:
            raise ValueError(f"slice_doubling_share must be in [0, 1); got {self.slice_doubling_share}.")
        if any(not bandwidth > 0 for _, bandwidth in self.chip_host_link):
            raise ValueError(f"chip_host_link bandwidths must be positive bytes/s; got {self.chip_host_link}.")

    def host_bytes_per_second(self, chip: ChipSpec) -> float:
        """``chip``'s host link, bytes/s each way: its fitted value, else its own figure."""
        return dict(self.chip_host_link).get(chip.libtpu_name, chip.host_bytes_per_second)

    def slice_factor(self, slices: int) -> float:
        """How many times its program's time a step across ``slices`` slices takes (1 on one)."""
        return 1.0 + self.slice_doubling_share * math.log2(max(slices, 1))

    def efficiencies(self, chip: str) -> tuple[float, float]:
        """``(matmul, attention)`` efficiency on ``chip`` (a `ChipSpec.libtpu_name`)."""
        fitted = self.fitted_generation(chip)
        if fitted is None:
            return self.matmul_efficiency, self.attention_efficiency
        own = dict(self.chip_efficiency)[fitted]
        return own, own

    def fitted_generation(self, chip: str) -> str | None:
        """The fitted generation whose efficiency ``chip`` takes: ``chip`` itself, else the first
        whose matrix unit has its side; ``None``: the joint values."""
        fitted = [c for c, _ in self.chip_efficiency]
        if chip in fitted:
            return chip
        side = CHIP_SPECS[chip].mxu if chip in CHIP_SPECS else None
        return next((c for c in fitted if c in CHIP_SPECS and CHIP_SPECS[c].mxu == side), None)


# Fitted on the runs CALIBRATION_RUNS names and on nothing else (docs/plan.md, "Calibration";
# benchmarks/plan_prediction.py plans each with its recipe's shape and records the step it predicts
# at 26 efficiencies in tests/data/plan_calibration.json, from which test_calibration.py refits):
# tpu-recipes' two Ironwood runs (Llama 3.1-70B on 64 chips, 1,207 TFLOP/s/chip; 405B on 256,
# 1,261), MaxText's v5e-256 runs of its 16B, 32B and 64B models (120, 132, 118) and tpu-recipes'
# four Trillium runs of dense full-attention models on one v6e-256 (Llama 3.1-8B and 70B, Llama
# 2-70B, GPT-3 175B, in the planner's FLOP count). Each fit is the value that makes the largest of
# its runs' errors smallest. The generations do not reach the same share of their peak, so each
# has its own, matmuls and attention alike (their runs cannot tell the two apart): TPU7x 0.791
# (+2.1 %, -2.2 %), v5e 0.927 (+2.5 %, -2.6 %, +1.9 %), and v6e 0.736 with its host link at 44 GB/s
# each way (-4.4 %, +4.8 %, -2.2 %, -4.8 %), the two fitted together (`fit_efficiency_and_host_link`:
# at the scaling book's 32 GB/s no one efficiency put the 8B's offloading runs, which wait on the
# link, and the 70B's within 10 %; the 44 GB/s is what the model needs, not a measured speed).
# Held out on v6e, thirteen runs within 9.6 % (the 8B and 70B on smaller slices, Mistral 7B, the
# 405B on 2 slices, Gemma 3 on 1, 2 and 4): the calibration runs were chosen after nine of them had
# been seen within 5.7 % at 0.68 and 48 GB/s. A chip with no run of its own takes the fitted
# generation's with its matrix unit: v4 and v5p (128 x 128, as v5e) 0.927; that rule was chosen
# after the held-out runs' errors at the joint fit had been seen (v5p -11.2 %; with it -4.9 %). The
# joint fit over all nine, 0.809, serves a chip with neither.
# Refit (from v5e 0.958, joint 0.821) when libtpu's async collective fusions (v5e's programs alone)
# were costed as what they are: the collective on the links from its start to its done, the
# continuation fusions' HBM traffic their own compute's (the buffers they pass through were
# counted as read and written in each); before that (from TPU7x 0.786, v5e 0.949, v6e 0.703 and 46 GB/s, joint 0.804) when every causal splash
# kernel was costed by the pairs of blocks it runs, the diagonal's whole (`attended_pairs`), and a
# convolution whose kernel lists its spatial dims out of order was counted right (GPT-3 175B's), and
# before that (from TPU7x 0.760, joint 0.852) when host transfers were costed on the chip's PCIe link
# (the 405B offloads each layer's input: 12.7 s a step each way at TPU7x's 16 GB/s, of which the
# schedule leaves part exposed), and
# before that (from TPU7x 0.763, joint 0.836) after three fixes of the step-time model (a splash
# kernel's head-dim matmuls fill head_dim / MXU of the unit; a layer written into or read from its
# scan stack through a relayout in place moves the layer, not the stack; a long sequence's int16
# mask table is not the kernel's q) and the 70B run planned with its recipe's remat
# (save_qkv_context; it was `full`). Not fitted, set before looking: ring_step_seconds, a 1 us ICI
# hop (0 moves the Ironwood predictions by +1.3 and +1.2 points, 10 us by -11 and -11). Every
# other chip's host link is its own figure (`ChipSpec.host_bytes_per_second`, the JAX scaling book's).
CALIBRATION = Calibration(
    matmul_efficiency=0.809,
    attention_efficiency=0.809,
    ring_step_seconds=1e-6,
    chip_efficiency=(("tpu7x", 0.791), ("v5e", 0.927), ("v6e", 0.736)),
    slice_doubling_share=0.031,
    chip_host_link=(("v6e", 44e9),),
)

# The runs the efficiencies are fitted on (`spmd.plan.predict.published.run_name`); every other published
# run with a recipe is held out: predicted, never fitted to (benchmarks/plan_prediction.py).
# MaxText's v5p-128 runs are not among them: the planner's 2-D program is not MaxText's (at the
# 64B's own batch 1.64 s of its 8.17 s step is communication it does not overlap, where MaxText's
# whole step is 7.26 s; the 32B's, 1.05 s of 7.06 s), so no efficiency fitted to them would stand for the
# chip (docs/plan.md, "Calibration").
CALIBRATION_RUNS: tuple[str, ...] = (
    "llama3.1-70b@tpu7x-128",
    "llama3.1-405b@tpu7x-512",
    "maxtext-16b@v5e-256",
    "maxtext-32b@v5e-256",
    "maxtext-64b@v5e-256",
    "llama3.1-8b@v6e-256",
    "llama3.1-70b@v6e-256",
    "llama2-70b@v6e-256",
    "gpt3-175b@v6e-256",
)


@dataclass(frozen=True)
class CalibrationPoint:
    """One published run as the fit sees it: the step the model predicts for the run's compiled
    program at each of a few matmul efficiencies (the same value for attention), and the figure
    the run published. ``benchmarks/plan_prediction.py`` records these.

    Attributes:
        run: the run's name (`spmd.plan.predict.published.run_name`).
        published_tflops: TFLOP/s per chip the run published (MaxText's FLOP count).
        model_flops_per_chip: the model's FLOPs per step per chip (the same count).
        efficiencies: increasing efficiencies the step was predicted at.
        seconds: the predicted step at each.
        host_bytes_per_second: the chip's host link, each way, the steps were predicted with.
    """

    run: str
    published_tflops: float
    model_flops_per_chip: float
    efficiencies: tuple[float, ...]
    seconds: tuple[float, ...]
    host_bytes_per_second: float

    def predicted_tflops(self, efficiency: float) -> float:
        """TFLOP/s per chip at ``efficiency``: the recorded steps interpolated linearly in
        1 / efficiency (matmul time goes as 1 / efficiency; within a grid step the program's mix
        of matmul- and memory-bound operations barely changes)."""
        e = self.efficiencies
        if not e[0] <= efficiency <= e[-1]:
            raise ValueError(f"efficiency {efficiency} is outside the recorded {e[0]} .. {e[-1]}.")
        i = min(max(bisect.bisect_left(e, efficiency), 1), len(e) - 1)
        x0, x1, x = 1 / e[i - 1], 1 / e[i], 1 / efficiency
        seconds = self.seconds[i - 1] + (self.seconds[i] - self.seconds[i - 1]) * (x - x0) / (x1 - x0)
        return self.model_flops_per_chip / seconds / 1e12

    def error(self, efficiency: float) -> float:
        """(predicted - published) / published at ``efficiency``."""
        return self.predicted_tflops(efficiency) / self.published_tflops - 1


def fit_efficiency(points: Sequence[CalibrationPoint], resolution: float = 0.001) -> float:
    """The efficiency, on a ``resolution`` grid, that makes the largest of the points' absolute
    errors smallest (a minimax fit: no run is given up to fit the others better)."""
    if not points:
        raise ValueError("fit_efficiency needs at least one calibration point.")
    lo = max(p.efficiencies[0] for p in points)
    hi = min(p.efficiencies[-1] for p in points)
    return _minimax(points, lo, hi, resolution)


def fit_efficiency_and_host_link(points: Sequence[CalibrationPoint], resolution: float = 0.001) -> tuple[float, float]:
    """``(efficiency, host link)`` that make the largest of the points' absolute errors smallest:
    the points hold each run at several host links (``host_bytes_per_second``), and at each link
    the efficiency is `fit_efficiency`'s; the slowest link on a tie."""
    by_link: dict[float, list[CalibrationPoint]] = {}
    for p in points:
        by_link.setdefault(p.host_bytes_per_second, []).append(p)
    runs = {frozenset(p.run for p in group) for group in by_link.values()}
    if len(runs) != 1 or len(by_link) < 2:
        raise ValueError("fit_efficiency_and_host_link needs the same runs at each of two or more host links.")

    def worst(link: float) -> tuple[float, float, float]:
        efficiency = fit_efficiency(by_link[link], resolution)
        return max(abs(p.error(efficiency)) for p in by_link[link]), link, efficiency

    _, link, efficiency = min(worst(link) for link in by_link)
    return efficiency, link


def _minimax(points: Sequence[CalibrationPoint] | Sequence[SliceScaling], lo: float, hi: float, step: float) -> float:
    """The value on the grid ``lo, lo + step, ... <= hi`` that makes the largest of the points'
    absolute errors (``point.error(value)``) smallest; the smallest such value on a tie."""
    grid = [round(lo + k * step, 6) for k in range(int((hi - lo) / step + 1e-9) + 1)]
    return min(grid, key=lambda v: (max(abs(p.error(v)) for p in points), v))


# The runs the slice term is fitted on: MaxText's v5e README, each of its four models on 2 to 32
# v5e-256 slices (DCN data parallelism), against the same model on one. Only their published
# figures are fitted: the ratio of a run's TFLOP/s per chip to its one-slice run's, which the
# step-time model cannot derive (the program's sends are hidden, so its prediction is the same on
# any number of slices). Per doubling of the slices the 20 ratios give a step from 0 % (the 128B
# on 2) to 5.4 % (the 64B on 2) longer, 2.3 % in the median; the minimax value, 3.1 %, leaves each
# ratio within 4.7 %. Held out: the v5p README's rows on 2 slices (docs/plan.md, "Calibration").
SLICE_CALIBRATION_RUNS: tuple[str, ...] = tuple(
    f"maxtext-{size}@{slices}xv5e-256" for size in ("16b", "32b", "64b", "128b") for slices in (2, 4, 8, 16, 32)
)


@dataclass(frozen=True)
class SliceScaling:
    """A published run on several slices beside the same recipe on one, as the slice term's fit
    sees it.

    Attributes:
        run: the multi-slice run's name (`spmd.plan.predict.published.run_name`).
        slices: its slices.
        ratio: its published TFLOP/s per chip over the one-slice run's.
    """

    run: str
    slices: int
    ratio: float

    def __post_init__(self) -> None:
        if self.slices < 2 or self.ratio <= 0:
            raise ValueError(f"{self.run}: a slice scaling needs 2 or more slices and a positive ratio.")

    def error(self, share: float) -> float:
        """(predicted - published) / published of the ratio, with ``share`` per doubling."""
        return 1 / (1 + share * math.log2(self.slices)) / self.ratio - 1


def fit_slice_share(points: Sequence[SliceScaling], resolution: float = 0.001, highest: float = 0.2) -> float:
    """The share per doubling, on a ``resolution`` grid from 0 to ``highest``, that makes the
    largest of the points' absolute errors smallest (minimax, as `fit_efficiency`)."""
    if not points:
        raise ValueError("fit_slice_share needs at least one published run on several slices.")
    return _minimax(points, 0.0, highest, resolution)
