"""TPU slices by name (``v5p-128``, ``v5e-256``, ``tpu7x-128``) and the chip figures the planner's
estimate uses.

Slice names count TensorCores on v2-v4, v5p and TPU7x (two per chip: ``v5p-128`` is 64 chips,
``tpu7x-128`` 64) and chips on v5e and v6e (``v5e-256`` is 256 chips), as Cloud TPU names them.
libtpu's compiler takes a physical chip grid instead (``v5p:4x4x4``, ``tpu7x:4x4x4``); `parse_slice`
turns one into the other with Cloud TPU's default shapes.

The planner's unit is the JAX device, what a mesh axis counts: one per chip, except TPU7x
(Ironwood), whose two TensorCores are two devices (``device_kind`` "TPU7x"), each with half the
chip's HBM, FLOP/s and links. ``tpu7x:2x2x1`` is 4 chips and 8 devices.

Chip figures (cloud.google.com/tpu/docs/<chip>, the project's anchors table), per chip:

| chip | bf16 TFLOP/s | HBM | HBM GB/s | MXU | devices | all-reduce GB/s | DCN GB/s | source of the all-reduce column |
|---|---|---|---|---|---|---|---|---|
| v4 | 275 | 32 GiB | 1200 | 128 | 1 | 268.6 | 3.125 | 1.1 PB/s all-reduce per 4096-chip pod |
| v5e | 197 | 16 GiB | 819 | 128 | 1 | 200 | 3.125 | 51.2 TB/s per 256-chip pod (= 1600 Gbps ICI) |
| v5p | 459 | 96 GiB | 2765 | 128 | 1 | 600 | 6.25 | 1200 GB/s bidirectional ICI (4800 Gbps each way) |
| v6e | 918 | 32 GiB | 1638 | 256 | 1 | 400 | 12.5 | 102.4 TB/s per 256-chip pod (800 GB/s bidirectional) |
| tpu7x | 2307 | 192 GiB | 7380 | 256 | 2 | 600 | 12.5 | 1200 GB/s bidirectional ICI, as v5p |

The MXU column is the side of the matrix unit's systolic array (128 x 128 through v5p, 256 x 256
from v6e on): a matmul dimension is padded to a multiple of it, which the step-time model counts
(`spmd.plan.predict._step_time`).

HBM is the compiler's verdict first: libtpu fails a compile that does not fit its device (v5e: "Used
45.97G of 15.75G hbm", 16 GiB less 0.25 GiB it reserves), and the planner reports that as OOM;
the table's figure is the budget a successful compile is compared against. Cloud's "95 GB" (v5p)
and "32 GB" (v6e) are binary: libtpu 0.0.52 gives a device 95.73 GiB on v5p, 31.24 GiB on v6e,
15.75 GiB on v5e and 94.74 GiB on TPU7x ("exceeds available HBM (95.73G)"), so the table holds 96
and 32 GiB (it held 95e9 and 32e9 bytes, 88.48 and 29.80 GiB: budgets 7.3 and 1.4 GiB below
what the compiler places).

Across slices (multi-slice, DCN) the estimate uses each chip's data center network bandwidth:
Cloud's per-chip figures for v5p (50 Gbps), v6e and TPU7x (100 Gbps); v5e's 6.4 Tbps per
256-chip pod (2 x 100 Gbps NICs per 8-chip host) for v5e, and the same figure for v4, whose
per-chip DCN is not published (an assumption, stated in reports).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from spmd._util.memory import GIB
from spmd.mfu.peak import CHIPS
from spmd.plan.errors import TopologyError

__all__ = [
    "ChipSpec",
    "CHIP_SPECS",
    "MAX_CHIPS",
    "MAX_CHIPS_PER_SLICE",
    "MAX_SLICES",
    "TpuSlice",
    "TopologyError",
    "parse_slice",
]


# The host link (PCIe) of a chip, each way: "typically around 1.6e10 bytes / second per TPU
# (3.2e10 for TPU v6e)", the JAX scaling book's TPU chapter (jax-ml/scaling-book tpus.md).
_PCIE = 16e9


@dataclass(frozen=True)
class ChipSpec:
    """One TPU generation, per chip: libtpu's name, peak bf16 FLOP/s, HBM bytes, all-reduce and
    DCN bytes/s; JAX devices per chip; whether slice names count cores (two per chip) and whether
    the torus is 3-D; HBM bytes/s, the matrix unit's side, and the host link's bytes/s each way
    (PCIe: host offload's transfers). The ``device_`` properties divide by the devices a chip has."""

    name: str
    libtpu_name: str
    peak_flops: float
    hbm_bytes: int
    allreduce_bytes_per_second: float
    dcn_bytes_per_second: float
    names_count_cores: bool
    three_d: bool
    devices_per_chip: int = 1
    hbm_bytes_per_second: float = 0.0
    mxu: int = 128
    host_bytes_per_second: float = _PCIE

    @property
    def device_peak_flops(self) -> float:
        return self.peak_flops / self.devices_per_chip

    @property
    def device_hbm_bytes(self) -> int:
        return self.hbm_bytes // self.devices_per_chip

    @property
    def device_allreduce_bytes_per_second(self) -> float:
        return self.allreduce_bytes_per_second / self.devices_per_chip

    @property
    def device_dcn_bytes_per_second(self) -> float:
        return self.dcn_bytes_per_second / self.devices_per_chip

    @property
    def device_hbm_bytes_per_second(self) -> float:
        return self.hbm_bytes_per_second / self.devices_per_chip


_POD_DCN = 6.4e12 / 8 / 256  # v5e: 6.4 Tbps per 256-chip pod, per chip
# Peak FLOP/s have one home, spmd.mfu.peak; HBM and interconnect are the planner's.
CHIP_SPECS: dict[str, ChipSpec] = {
    "v4": ChipSpec(
        "TPU v4",
        "v4",
        CHIPS["v4"].peak_flops,
        32 * GIB,
        1.1e15 / 4096,
        _POD_DCN,
        True,
        True,
        hbm_bytes_per_second=1200e9,
    ),
    "v5e": ChipSpec(
        "TPU v5e",
        "v5e",
        CHIPS["v5e"].peak_flops,
        16 * GIB,
        51.2e12 / 256,
        _POD_DCN,
        False,
        False,
        hbm_bytes_per_second=819e9,
    ),
    "v5p": ChipSpec(
        "TPU v5p",
        "v5p",
        CHIPS["v5p"].peak_flops,
        96 * GIB,
        4800e9 / 8,
        50e9 / 8,
        True,
        True,
        hbm_bytes_per_second=2765e9,
    ),
    "v6e": ChipSpec(
        "TPU v6e",
        "v6e",
        CHIPS["v6e"].peak_flops,
        32 * GIB,
        102.4e12 / 256,
        100e9 / 8,
        False,
        False,
        hbm_bytes_per_second=1638e9,
        mxu=256,
        host_bytes_per_second=2 * _PCIE,
    ),
    "tpu7x": ChipSpec(
        "TPU7x",
        "tpu7x",
        CHIPS["7x"].peak_flops,
        192 * GIB,
        1200e9 / 2,
        100e9 / 8,
        True,
        True,
        CHIPS["7x"].devices_per_chip,
        hbm_bytes_per_second=7380e9,
        mxu=256,
    ),
}


@dataclass(frozen=True)
class TpuSlice:
    """A TPU slice (or several, joined by DCN).

    Attributes:
        name: as given (``v5p-128``).
        chip: the generation's `ChipSpec`.
        shape: the physical chip grid of one slice (``(4, 4, 4)``).
        slices: slices joined over the data center network.
    """

    name: str
    chip: ChipSpec
    shape: tuple[int, ...]
    slices: int = 1

    @property
    def chips_per_slice(self) -> int:
        return math.prod(self.shape)

    @property
    def chips(self) -> int:
        return self.chips_per_slice * self.slices

    @property
    def devices_per_slice(self) -> int:
        """JAX devices (mesh positions) of one slice: chips, or TensorCores on TPU7x."""
        return self.chips_per_slice * self.chip.devices_per_chip

    @property
    def devices(self) -> int:
        return self.devices_per_slice * self.slices

    @property
    def libtpu_topology(self) -> str:
        """The name libtpu's compiler takes (``v5p:4x4x4``)."""
        return f"{self.chip.libtpu_name}:{'x'.join(map(str, self.shape))}"


def _default_shape(chips: int, three_d: bool) -> tuple[int, ...]:
    """Cloud TPU's default grid: the most cubic (3-D) or square (2-D) power-of-two grid, the
    shortest sides first (v5p-128 -> 4x4x4, v5p-256 -> 4x4x8, v5e-128 -> 8x16)."""
    if chips & (chips - 1):
        raise TopologyError(f"{chips} chips is not a power of two; give the shape instead, e.g. 'v5p:4x4x6'.")
    k = chips.bit_length() - 1
    parts = 3 if three_d else 2
    if three_d and chips <= 8:  # Cloud TPU's smallest 3-D slices: 2x2x1 and 2x2x2
        if chips < 4:
            raise TopologyError(f"{chips} chips: the smallest 3-D slice has 4 chips (2x2x1).")
        return (2, 2, chips // 4)
    exps = [k // parts + (1 if i >= parts - k % parts else 0) for i in range(parts)]
    return tuple(sorted(2**e for e in exps))


_NAME = re.compile(r"^(?P<gen>v4|v5e|v5litepod|v5p|v6e|tpu7x)(?:-(?P<count>\d+)|:(?P<shape>\d+(?:x\d+){1,2}))$")


def parse_slice(name: str, slices: int = 1) -> TpuSlice:
    """A `TpuSlice` from ``v5p-128``, ``v5e-256``, ``v6e-64``, ``v4-128``, ``tpu7x-128`` or a
    physical chip grid ``v5p:4x4x8``, ``tpu7x:2x2x1``.

    Raises:
        TopologyError: an unknown generation, a core count that is not a whole number of chips,
            a size Cloud TPU does not make as a default shape, or more than `MAX_CHIPS_PER_SLICE`
            chips a slice (`MAX_CHIPS` in all).
    """
    if not isinstance(slices, int) or isinstance(slices, bool) or slices < 1:
        raise TopologyError(f"slices must be a positive int, got {slices!r:.60}.")
    if slices > MAX_SLICES:
        raise TopologyError(
            f"slices={slices}: libtpu's compiler takes at most {MAX_SLICES} slices (at 512 it aborts the process)."
        )
    m = _NAME.match(name.strip().lower()) if isinstance(name, str) else None
    if m is None:
        raise TopologyError(
            f"Unknown TPU slice {name!r}. Use '<chip>-<count>' (v4-128, v5p-1024, tpu7x-128: cores; v5e-256, "
            f"v6e-64: chips) or '<chip>:<chip grid>' (v5p:4x4x8, v5e:16x16, tpu7x:2x2x1); chips: {sorted(CHIP_SPECS)}."
        )
    gen = "v5e" if m.group("gen") == "v5litepod" else m.group("gen")
    chip = CHIP_SPECS[gen]
    if m.group("shape"):
        shape = tuple(int(s) for s in m.group("shape").split("x"))
        if len(shape) != (3 if chip.three_d else 2) or min(shape) < 1:
            raise TopologyError(f"{name!r}: a {chip.name} slice has a {3 if chip.three_d else 2}-D shape.")
        return _bounded(TpuSlice(name, chip, shape, slices))
    count = int(m.group("count"))
    chips = count // 2 if chip.names_count_cores else count
    if chip.names_count_cores and (count < 2 or count % 2):
        raise TopologyError(f"{name!r}: {gen} slice names count cores, two per chip; give an even count >= 2.")
    if count < 1 or len(m.group("count")) > 6:
        raise TopologyError(f"{name!r}: {gen} slice names count chips; give a count from 1 to 999999.")
    try:
        shape = _default_shape(chips, chip.three_d)
    except TopologyError as e:  # say which name, in this chip's terms
        cores = f" (the name counts cores: {count} cores are {chips} chips)" if chip.names_count_cores else ""
        example = "4x4x6" if chip.three_d else "4x6"
        raise TopologyError(f"{name!r}{cores}: {e}".replace("'v5p:4x4x6'", f"'{gen}:{example}'")) from None
    return _bounded(TpuSlice(name, chip, shape, slices))


# The largest Cloud TPU slices have 8960 (v5p) and 9216 (TPU7x) chips, the largest multislice jobs
# tens of thousands: beyond these a name is a typo, and libtpu refuses it or compiles for hours.
MAX_CHIPS_PER_SLICE = 2**14
MAX_CHIPS = 2**17
# libtpu (0.0.20) checks NumSlices() < kMaxNumSlices = 512 and aborts the process (SIGABRT) otherwise.
MAX_SLICES = 511


def _bounded(target: TpuSlice) -> TpuSlice:
    if target.chips_per_slice > MAX_CHIPS_PER_SLICE:
        raise TopologyError(
            f"{target.name!r} has {target.chips_per_slice} chips; no TPU slice has more than {MAX_CHIPS_PER_SLICE}. "
            "Give a real slice (e.g. v5p-1024, v5e:16x16) and join several with --slices."
        )
    if target.chips > MAX_CHIPS:
        raise TopologyError(
            f"{target.slices} slices of {target.name!r} are {target.chips} chips, more than {MAX_CHIPS}; "
            "give fewer slices."
        )
    return target
