"""A plan's result: per-device memory from the TPU compiler, collectives, FLOPs, the estimated
step time and MFU (`spmd.plan.estimate`), what compiled it, and the verdict. Table and JSON forms.

Memory is per device (a mesh position: a chip, or a TensorCore on TPU7x) and, where a chip has
several devices, per chip too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from spmd.plan import estimate as _estimate
from spmd.plan.errors import PlanError
from spmd.plan.estimate import StepEstimate

__all__ = ["CollectiveSummary", "MemoryReport", "PlanReport", "StepEstimate", "summarize"]

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class MemoryReport:
    """Per-device bytes from the compiled executable's ``memory_analysis()``.

    ``total`` is arguments + outputs - aliased (donated state written in place) + temporaries:
    what the device holds at the step's peak. ``predicted_argument_bytes`` is our sharding math's
    sum of each argument's largest block, before the TPU's tiled layouts pad small dims.
    ``host_temp_bytes``: activations offloaded to the host's memory (``--remat offload``).
    ``largest_allocations``: the compiler's largest buffers.

    When the TPU compiler itself refuses the program for lack of HBM there is no memory
    analysis: ``compiler_oom_bytes`` holds the usage its error reports (the other byte fields
    are 0). ``compiler_accepted``: the compiler placed the step in the device's HBM, which is the
    verdict when the budget is the device's own (the analysis's categories can add up to a little
    more than the HBM it accepted).
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    predicted_argument_bytes: int
    hbm_bytes: int
    compiler_oom_bytes: int | None = None
    largest_allocations: tuple[str, ...] = ()
    compiler_accepted: bool = False
    host_temp_bytes: int = 0
    devices_per_chip: int = 1

    @property
    def total_bytes(self) -> int:
        if self.compiler_oom_bytes is not None:
            return self.compiler_oom_bytes
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def fits(self) -> bool:
        if self.compiler_oom_bytes is not None:
            return False
        return self.compiler_accepted or self.total_bytes <= self.hbm_bytes

    @property
    def margin_bytes(self) -> int:
        """HBM left at the peak (negative: short by that much)."""
        return self.hbm_bytes - self.total_bytes

    @property
    def fits_with_no_margin(self) -> bool:
        """The compiler placed the step, though its analysis adds up to more than the device's
        nominal HBM: it fits, with nothing to spare."""
        return self.fits and self.margin_bytes < 0

    def short_verdict(self) -> str:
        """``fits``, ``fits (compiler; no margin)`` or ``OOM (-x.xx GiB)``: a table cell."""
        if self.fits_with_no_margin:
            return "fits (compiler; no margin)"
        return "fits" if self.fits else f"OOM (-{-self.margin_bytes / GIB:.2f} GiB)"


@dataclass(frozen=True)
class CollectiveSummary:
    """Collectives of one kind in a step, per device."""

    kind: str
    count: int
    bytes_sent_per_chip: int
    dcn_bytes_sent_per_chip: int = 0


@dataclass(frozen=True)
class PlanReport:
    """Everything `spmd.plan.plan` found for one (model, topology, mesh, strategy, remat, attention).

    ``splash_kernels``: splash attention kernels in the program (`spmd.plan.program.splash_kernels`).
    ``toolchain``: what compiled it (`spmd.plan._compat.Toolchain` as a dict: the partitioner,
    jax, jaxlib, libtpu, torch, torchax, and ``device_order``, how jax ordered the mesh's devices:
    ``jax 0.12.0.1 mesh_utils (core axis first)`` on TPU7x).
    """

    model: str
    topology: str
    chip: str
    chips: int
    devices: int
    slices: int
    mesh: dict[str, int]
    strategy: str
    global_batch: int
    seq_len: int
    compute_dtype: str
    remat: str
    attention: str
    n_params: int
    scanned_layers: int
    memory: MemoryReport
    collectives: tuple[CollectiveSummary, ...]
    xla_flops: float
    xla_bytes_accessed: float
    estimate: StepEstimate
    compile_seconds: float
    splash_kernels: int = 0
    toolchain: dict[str, str] = field(default_factory=dict)
    param_specs: dict[str, str] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def per_device_batch(self) -> float:
        """Sequences per batch shard (every mesh axis but ``tensor``)."""
        return self.global_batch * self.mesh.get("tensor", 1) / self.devices

    @property
    def tokens_per_second(self) -> float:
        """Estimated training throughput with no communication hidden (the conservative end)."""
        return self.global_batch * self.seq_len / self.estimate.step_seconds_serial

    def verdict(self) -> str:
        m = self.memory
        if m.fits_with_no_margin:
            return (
                f"FITS: the TPU compiler placed the step in the device's HBM, though its memory analysis adds up "
                f"to {m.total_bytes / GIB:.2f} GiB of a nominal {m.hbm_bytes / GIB:.2f} GiB (no margin left)"
            )
        if m.fits:
            return (
                f"FITS: {m.total_bytes / GIB:.2f} GiB of {m.hbm_bytes / GIB:.2f} GiB HBM per device "
                f"({m.margin_bytes / GIB:.2f} GiB free)"
            )
        return (
            f"OOM: {m.total_bytes / GIB:.2f} GiB needed, {m.hbm_bytes / GIB:.2f} GiB HBM per device "
            f"({-m.margin_bytes / GIB:.2f} GiB short)"
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["memory"]["total_bytes"] = self.memory.total_bytes
        out["memory"]["margin_bytes"] = self.memory.margin_bytes
        out["fits"] = self.fits
        out["verdict"] = self.verdict()
        out["estimate_model"] = " ".join(_estimate.__doc__.split("\n\n", 1)[1].split())
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanReport:
        """The report `to_dict` wrote (derived keys ignored).

        Raises:
            PlanError: ``data`` is not such a report (a key missing, a value of the wrong kind).
        """
        try:
            return cls._from_dict(data)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise PlanError(f"Not a plan report: {type(e).__name__} {str(e)[:200]}.") from None

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> PlanReport:
        d = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        memory = {k: v for k, v in d["memory"].items() if k in MemoryReport.__dataclass_fields__}
        memory["largest_allocations"] = tuple(memory.get("largest_allocations", ()))
        d["memory"] = MemoryReport(**memory)
        d["collectives"] = tuple(CollectiveSummary(**c) for c in d["collectives"])
        d["estimate"] = StepEstimate(**d["estimate"])
        return cls(**d)

    def with_hbm(self, hbm_bytes: int) -> PlanReport:
        """The same report judged against a different per-device memory budget (below the
        device's HBM, by the memory analysis alone)."""
        accepted = self.memory.compiler_accepted and hbm_bytes >= self.memory.hbm_bytes
        return replace(self, memory=replace(self.memory, hbm_bytes=hbm_bytes, compiler_accepted=accepted))

    def table(self) -> str:
        from spmd.plan.report_text import plan_table

        return plan_table(self)


def summarize(collectives: list[Any]) -> tuple[CollectiveSummary, ...]:
    """Per-kind totals of `spmd.plan.program.StepCollective` values (DCN: those with ``over_dcn``)."""
    counts: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    dcn: Counter[str] = Counter()
    for c in collectives:
        kind = c.kind.value if not c.implements else f"{c.kind.value} as {c.implements}"
        counts[kind] += c.count
        sent[kind] += c.bytes_sent_per_device
        if c.over_dcn:
            dcn[kind] += c.bytes_sent_per_device
    return tuple(CollectiveSummary(k, counts[k], sent[k], dcn[k]) for k in sorted(counts))
