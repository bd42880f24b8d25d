"""A plan's result: per-chip memory from the TPU compiler, collectives, FLOPs, an estimated step
time and MFU, and the verdict. Table and JSON forms.

The estimate (stated in every report): compute time is the step's model FLOPs per chip over the
chip's peak bf16 FLOP/s (x 4/3 with gradient checkpointing, which runs the forward twice);
communication time is each collective's ring bytes sent per chip over the chip's all-reduce
bandwidth (`spmd.plan.topology`), over DCN's for collectives that cross slices. The step takes
at least the larger of the two (all communication hidden behind compute) and at most their sum
(none hidden); MFU is given for both.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = ["CollectiveSummary", "MemoryReport", "PlanReport", "StepEstimate"]

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class MemoryReport:
    """Per-chip bytes from the compiled executable's ``memory_analysis()``.

    ``total`` is arguments + outputs - aliased (donated state written in place) + temporaries:
    what the chip holds at the step's peak. ``predicted_argument_bytes`` is our sharding math's
    sum of each argument's largest block, before the TPU's tiled layouts pad small dims.

    When the TPU compiler itself refuses the program for lack of HBM there is no memory
    analysis: ``compiler_oom_bytes`` holds the usage its error reports (the other byte fields
    are 0) and ``largest_allocations`` its list of the biggest buffers. ``compiler_accepted``:
    the compiler placed the step in the chip's HBM, which is the verdict when the budget is the
    chip's own (the analysis's categories can add up to a little more than the HBM it accepted).
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
        """The compiler placed the step, though its analysis adds up to more than the chip's
        nominal HBM: it fits, with nothing to spare."""
        return self.fits and self.margin_bytes < 0

    def short_verdict(self) -> str:
        """``fits``, ``fits (compiler; no margin)`` or ``OOM (-x.xx GiB)``: a table cell."""
        if self.fits_with_no_margin:
            return "fits (compiler; no margin)"
        return "fits" if self.fits else f"OOM (-{-self.margin_bytes / GIB:.2f} GiB)"


@dataclass(frozen=True)
class CollectiveSummary:
    """Collectives of one kind in a step, per chip."""

    kind: str
    count: int
    bytes_sent_per_chip: int
    dcn_bytes_sent_per_chip: int = 0


@dataclass(frozen=True)
class StepEstimate:
    """The step-time model of the module docstring."""

    model_flops_per_step: float
    compute_seconds: float
    ici_seconds: float
    dcn_seconds: float
    step_seconds_overlapped: float
    step_seconds_serial: float
    mfu_overlapped: float
    mfu_serial: float


@dataclass(frozen=True)
class PlanReport:
    """Everything `spmd.plan.plan` found for one (model, topology, mesh, strategy)."""

    model: str
    topology: str
    chip: str
    chips: int
    slices: int
    mesh: dict[str, int]
    strategy: str
    global_batch: int
    seq_len: int
    compute_dtype: str
    gradient_checkpointing: bool
    n_params: int
    scanned_layers: int
    memory: MemoryReport
    collectives: tuple[CollectiveSummary, ...]
    xla_flops: float
    xla_bytes_accessed: float
    estimate: StepEstimate
    compile_seconds: float
    param_specs: dict[str, str] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def verdict(self) -> str:
        m = self.memory
        if m.fits_with_no_margin:
            return (
                f"FITS: the TPU compiler placed the step in the chip's HBM, though its memory analysis adds up "
                f"to {m.total_bytes / GIB:.2f} GiB of a nominal {m.hbm_bytes / GIB:.2f} GiB (no margin left)"
            )
        if m.fits:
            return f"FITS: {m.total_bytes / GIB:.2f} GiB of {m.hbm_bytes / GIB:.2f} GiB HBM per chip ({m.margin_bytes / GIB:.2f} GiB free)"
        return f"OOM: {m.total_bytes / GIB:.2f} GiB needed, {m.hbm_bytes / GIB:.2f} GiB HBM per chip ({-m.margin_bytes / GIB:.2f} GiB short)"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["memory"]["total_bytes"] = self.memory.total_bytes
        out["memory"]["margin_bytes"] = self.memory.margin_bytes
        out["fits"] = self.fits
        out["verdict"] = self.verdict()
        out["estimate_model"] = __doc__.split("The estimate (stated in every report): ")[1].strip()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanReport:
        """The report `to_dict` wrote (derived keys ignored)."""
        fields = {f for f in cls.__dataclass_fields__}
        d = {k: v for k, v in data.items() if k in fields}
        memory = {k: v for k, v in d["memory"].items() if k in MemoryReport.__dataclass_fields__}
        memory["largest_allocations"] = tuple(memory.get("largest_allocations", ()))
        d["memory"] = MemoryReport(**memory)
        d["collectives"] = tuple(CollectiveSummary(**c) for c in d["collectives"])
        d["estimate"] = StepEstimate(**d["estimate"])
        return cls(**d)

    def with_hbm(self, hbm_bytes: int) -> PlanReport:
        """The same report judged against a different per-chip memory budget (below the chip's
        HBM, by the memory analysis alone)."""
        accepted = self.memory.compiler_accepted and hbm_bytes >= self.memory.hbm_bytes
        return replace(self, memory=replace(self.memory, hbm_bytes=hbm_bytes, compiler_accepted=accepted))

    @property
    def tokens_per_second(self) -> float:
        """Estimated training throughput with no communication hidden (the conservative end)."""
        return self.global_batch * self.seq_len / self.estimate.step_seconds_serial

    def table(self) -> str:
        m, e = self.memory, self.estimate
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
        lines = [
            f"{self.model} on {self.topology} ({self.chips} x {self.chip}, {self.slices} slice(s)); mesh {mesh}; "
            f"{self.strategy}; batch {self.global_batch} x {self.seq_len}; {self.compute_dtype}"
            f"{'; gradient checkpointing' if self.gradient_checkpointing else ''}",
            f"parameters {self.n_params / 1e9:.3f} B; {self.scanned_layers} layers scanned; compiled in {self.compile_seconds:.0f} s",
            "",
            "per-chip HBM (TPU compiler)        GiB",
        ]
        if m.compiler_oom_bytes is None:
            lines += [
                f"  arguments (params, AdamW, batch) {m.argument_bytes / GIB:9.3f}   (our sharding math: {m.predicted_argument_bytes / GIB:.3f})",
                f"  outputs - aliased                {(m.output_bytes - m.alias_bytes) / GIB:9.3f}",
                f"  temporaries                      {m.temp_bytes / GIB:9.3f}",
                f"  total                            {m.total_bytes / GIB:9.3f}   of {m.hbm_bytes / GIB:.2f}",
            ]
        else:
            lines += [
                f"  the TPU compiler ran out of HBM: {m.compiler_oom_bytes / GIB:.2f} GiB used "
                f"(arguments by our sharding math: {m.predicted_argument_bytes / GIB:.3f}); largest buffers:",
                *(f"    {a}" for a in m.largest_allocations),
            ]
        if m.compiler_oom_bytes is not None:
            lines += ["", "no collectives or step estimate: the compiler stopped at memory assignment"]
        else:
            lines += ["", "collectives per step         count   MiB sent per chip"]
            for c in self.collectives:
                dcn = f"  ({c.dcn_bytes_sent_per_chip / MIB:.1f} over DCN)" if c.dcn_bytes_sent_per_chip else ""
                lines.append(f"  {c.kind:25s} {c.count:7d}   {c.bytes_sent_per_chip / MIB:12.1f}{dcn}")
            lines += [
                "",
                f"model FLOPs per step {e.model_flops_per_step:.3e}; XLA cost analysis (loop bodies once): "
                f"{self.xla_flops:.3e} FLOPs, {self.xla_bytes_accessed / GIB:.1f} GiB accessed",
                f"estimated step: compute {e.compute_seconds * 1e3:.1f} ms, ICI {e.ici_seconds * 1e3:.1f} ms, "
                f"DCN {e.dcn_seconds * 1e3:.1f} ms",
                f"  -> step {e.step_seconds_overlapped * 1e3:.1f} ms (communication hidden) .. "
                f"{e.step_seconds_serial * 1e3:.1f} ms (none hidden)",
                f"  -> roofline MFU bound {e.mfu_serial:.1%} (none hidden) .. {e.mfu_overlapped:.1%} (hidden); "
                "measured runs reach 40-70 % of peak (docs/plan.md)",
            ]
        lines += ["", self.verdict()]
        return "\n".join(lines)


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
