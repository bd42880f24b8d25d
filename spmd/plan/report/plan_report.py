"""A plan's result: per-device memory from the TPU compiler, collectives, FLOPs, the estimated
step time and MFU (`spmd.plan.predict.estimate`), what compiled it, and the verdict. Table and JSON forms.

Memory is per device (a mesh position: a chip, or a TensorCore on TPU7x) and, where a chip has
several devices, per chip too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mesh import Role
from spmd._util.memory import GIB, MIB, Allocation, MemoryUsage
from spmd.plan.errors import PlanError
from spmd.plan.predict import estimate as _estimate_module
from spmd.plan.predict.estimate import StepEstimate
from spmd.plan.predict.published import published_for

__all__ = [
    "REPORT_FORMAT", "CollectiveSummary", "ContextReport", "MemoryReport", "PlanReport", "StepEstimate", "plan_table",
    "summarize",
]  # fmt: skip

# The JSON `PlanReport.to_dict` writes. 2: ``memory`` is a `MemoryUsage` (``peak_bytes``; its
# ``output_bytes`` no longer counts aliased outputs). `PlanReport.from_dict` reads 1 and 2.
REPORT_FORMAT = 2


@dataclass(frozen=True, kw_only=True)
class MemoryReport(MemoryUsage):
    """A plan's per-device memory: the compiled step's `MemoryUsage` (the record the inspector
    fills too, here from the executable's ``memory_analysis()``, `MemoryUsage.from_memory_analysis`)
    judged against the device's memory budget.

    ``peak_bytes`` (``total_bytes``) is arguments + outputs not aliased + temporaries: what the
    device holds at the step's peak. ``predicted_argument_bytes`` is our sharding math's sum of
    each argument's largest block, before the TPU's tiled layouts pad small dims.
    ``host_temp_bytes``: activations offloaded to the host's memory (``--remat offload``).
    ``largest_allocations``: the compiler's largest buffers.

    When the TPU compiler itself refuses the program for lack of HBM there is no memory
    analysis: ``compiler_oom_bytes`` (and ``peak_bytes``) hold the usage its error reports (the
    other byte fields are 0). ``compiler_accepted``: the compiler placed the step in the device's
    HBM, which is the verdict when the budget is the device's own (the analysis's categories can
    add up to a little more than the HBM it accepted).
    """

    hbm_bytes: int
    predicted_argument_bytes: int = 0
    compiler_oom_bytes: int | None = None
    largest_allocations: tuple[str, ...] = ()
    compiler_accepted: bool = False
    devices_per_chip: int = 1

    @property
    def total_bytes(self) -> int:
        """The step's peak (``peak_bytes``), the name the planner's report has always used."""
        return self.peak_bytes

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryReport:
        """The memory `PlanReport.to_dict` wrote, either format: before ``report_format`` 2 the
        output size counted aliased outputs and there was no ``peak_bytes`` (derived keys ignored)."""
        d = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "peak_bytes" not in d:  # report_format 1: the compiler's output size, aliased outputs in it
            d["output_bytes"] -= d["alias_bytes"]
            oom = d.get("compiler_oom_bytes")
            d["peak_bytes"] = oom if oom is not None else d["argument_bytes"] + d["output_bytes"] + d["temp_bytes"]
        d["largest_allocations"] = tuple(d.get("largest_allocations", ()))
        d["allocations"] = tuple(Allocation(**a) for a in d.get("allocations", ()))
        return cls(**d)

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
class ContextReport:
    """A plan's context axis (context parallelism, `spmd.plan.request.context`), per device.

    Attributes:
        axis: the mesh axis the sequence is split over (``context``).
        size: its devices.
        tokens_per_shard: tokens of a sequence each context shard holds (load-balanced: two chunks).
        kv_bytes_per_layer: one layer's K (or V) gathered on a device, by the formula: sequences a
            batch shard x K/V heads (over ``tensor``) x sequence x head dim x the compute dtype's bytes.
        layers: the model's layers (each gathers its K and V).
        collectives: the collectives whose groups span the context axis alone, by kind (the K and V
            all-gathers of every layer, forward and again in backward where the policy keeps the
            projections only, and their gradients' reduce-scatters).
    """

    axis: str
    size: int
    tokens_per_shard: int
    kv_bytes_per_layer: int
    layers: int
    collectives: tuple[CollectiveSummary, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContextReport:
        return cls(**{**data, "collectives": tuple(CollectiveSummary(**c) for c in data.get("collectives", ()))})


@dataclass(frozen=True)
class PlanReport:
    """Everything `spmd.plan.plan` found for one (model, topology, mesh, strategy, remat, attention).

    ``splash_kernels``: splash attention kernels in the program (`spmd.plan.compile.program.splash_kernels`).
    ``toolchain``: what compiled it (`spmd.plan._jax_compat.Toolchain` as a dict: the partitioner,
    jax, jaxlib, libtpu, torch, torchax, and ``device_order``, how jax ordered the mesh's devices:
    ``jax 0.12.0.1 mesh_utils (core axis first)`` on TPU7x). ``context_parallel``: the context axis, its
    K/V gathers and collectives (`ContextReport`; ``None``: the sequence is not split).
    ``vocab_tiles``: chunks the loss was computed in (`spmd.plan.request.vocab_tiling`; 1: untiled).
    ``dcn_mesh``: the slices each mesh axis spans (`spmd.plan.request.dcn`; ``{}``: one slice).
    ``splash_blocks``: the splash kernel's block sizes given (`spmd.plan.request.splash_blocks`;
    ``{}``: the planner's own). ``scoped_vmem_kib``: the VMEM a kernel may take, given
    (`spmd.plan.request.settings.PlanSettings`; ``None``: libtpu's default). ``weight_dtype``: the
    stored parameters and second moment (MaxText's ``weight_dtype``). ``fused``: the sibling
    projections run as one matmul (`spmd.plan.request.fused_projections`: ``qkv``, ``mlp``).
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
    context_parallel: ContextReport | None = None
    vocab_tiles: int = 1
    dcn_mesh: dict[str, int] = field(default_factory=dict)
    splash_blocks: dict[str, int | bool] = field(default_factory=dict)
    scoped_vmem_kib: int | None = None
    weight_dtype: str = "float32"
    fused: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def per_device_batch(self) -> float:
        """Sequences per batch shard (every mesh axis but ``tensor`` and ``context``, which split
        each sequence's heads or tokens instead)."""
        shared = self.mesh.get(Role.TENSOR.value, 1) * self.mesh.get(Role.CONTEXT.value, 1)
        return self.global_batch * shared / self.devices

    @property
    def step_seconds(self) -> float:
        """The predicted step time; the roofline's no-overlap end where there is no prediction
        (a report from before the prediction existed)."""
        e = self.estimate
        return e.predicted_seconds if e.predicted else e.step_seconds_serial

    @property
    def tokens_per_second(self) -> float:
        """Training throughput at `step_seconds`."""
        return self.global_batch * self.seq_len / self.step_seconds

    @property
    def mfu(self) -> float:
        """The predicted MFU; the roofline's no-overlap end where there is no prediction."""
        e = self.estimate
        return e.predicted_mfu if e.predicted else e.mfu_serial

    @property
    def predicted_tflops_per_chip(self) -> float:
        """Model TFLOP/s per chip at the predicted step time (MaxText's count, as published runs give)."""
        e = self.estimate
        return e.model_flops_per_step / e.predicted_seconds / self.chips / 1e12 if e.predicted else 0.0

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
        out["report_format"] = REPORT_FORMAT
        out["memory"]["total_bytes"] = self.memory.total_bytes
        out["memory"]["margin_bytes"] = self.memory.margin_bytes
        out["fits"] = self.fits
        out["verdict"] = self.verdict()
        out["predicted_tflops_per_chip"] = self.predicted_tflops_per_chip
        out["estimate_model"] = " ".join(_estimate_module.__doc__.split("\n\n", 1)[1].split())
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
        d["memory"] = MemoryReport.from_dict(d["memory"])
        d["collectives"] = tuple(CollectiveSummary(**c) for c in d["collectives"])
        estimate = dict(d["estimate"])
        for key in ("flops_by_loop", "flops_by_op"):  # JSON's lists, the dataclass's tuples
            estimate[key] = tuple(estimate.get(key, ()))
        d["estimate"] = StepEstimate(**estimate)
        if d.get("context_parallel") is not None:
            d["context_parallel"] = ContextReport.from_dict(d["context_parallel"])
        d["fused"] = tuple(d.get("fused", ()))  # JSON's list
        return cls(**d)

    def with_hbm(self, hbm_bytes: int) -> PlanReport:
        """The same report judged against a different per-device memory budget (below the
        device's HBM, by the memory analysis alone)."""
        accepted = self.memory.compiler_accepted and hbm_bytes >= self.memory.hbm_bytes
        return replace(self, memory=replace(self.memory, hbm_bytes=hbm_bytes, compiler_accepted=accepted))

    def table(self) -> str:
        return plan_table(self)


def summarize(collectives: list[Any]) -> tuple[CollectiveSummary, ...]:
    """Per-kind totals of `spmd.plan.compile.program.StepCollective` values (DCN: those with ``over_dcn``)."""
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


# -- the report as a table ---------------------------------------------------------------


def _heading(r: PlanReport) -> list[str]:
    mesh = " x ".join(f"{k}={v}" for k, v in r.mesh.items())
    mesh += f" (across slices: {', '.join(f'{k}={v}' for k, v in r.dcn_mesh.items())})" if r.dcn_mesh else ""
    devices = f"{r.devices} devices, " if r.devices != r.chips else ""
    t = r.toolchain
    compiled_by = (
        f" by {t.get('partitioner', '?')} (jax {t.get('jax', '?')}, libtpu {t.get('libtpu', '?')}, "
        f"torch {t.get('torch', '?')}, torchax {t.get('torchax', '?')})"
    )
    order = f"; mesh device order: {t['device_order']}" if t.get("device_order") else ""
    return [
        f"{r.model} on {r.topology} ({r.chips} x {r.chip}, {devices}{r.slices} slice(s)); mesh {mesh}; {r.strategy}; "
        f"batch {r.global_batch} x {r.seq_len}; {r.compute_dtype}; remat {r.remat}; attention {r.attention}"
        + (f" ({r.splash_kernels} splash kernels)" if r.splash_kernels else "")
        + (f" (blocks {','.join(f'{k}={v}' for k, v in r.splash_blocks.items())})" if r.splash_blocks else "")
        + (f"; loss in {r.vocab_tiles} vocabulary tiles" if r.vocab_tiles > 1 else "")
        + (f"; scoped VMEM {r.scoped_vmem_kib} KiB" if r.scoped_vmem_kib else "")
        + (f"; {r.weight_dtype} weights" if r.weight_dtype != "float32" else "")
        + (f"; fused {' and '.join(r.fused)} projections" if r.fused else ""),
        f"parameters {r.n_params / 1e9:.3f} B; {r.scanned_layers} layers scanned; compiled in "
        f"{r.compile_seconds:.0f} s{compiled_by}{order}",
        "",
    ]


def _memory(r: PlanReport) -> list[str]:
    m = r.memory
    if m.compiler_oom_bytes is not None:
        listed = "; largest buffers:" if m.largest_allocations else ""
        return [
            "per-device HBM (TPU compiler)      GiB",
            f"  the TPU compiler ran out of HBM: {m.compiler_oom_bytes / GIB:.2f} GiB used "
            f"(arguments by our sharding math: {m.predicted_argument_bytes / GIB:.3f}){listed}",
            *(f"    {a}" for a in m.largest_allocations),
        ]
    per_chip = (
        f"   (per chip, {m.devices_per_chip} devices: {m.devices_per_chip * m.total_bytes / GIB:.2f} of "
        f"{m.devices_per_chip * m.hbm_bytes / GIB:.2f})"
        if m.devices_per_chip > 1
        else ""
    )
    lines = [
        "per-device HBM (TPU compiler)      GiB",
        f"  arguments (params, AdamW, batch) {m.argument_bytes / GIB:9.3f}   (our sharding math: {m.predicted_argument_bytes / GIB:.3f})",
        f"  outputs - aliased                {m.output_bytes / GIB:9.3f}",
        f"  temporaries                      {m.temp_bytes / GIB:9.3f}",
        f"  total                            {m.total_bytes / GIB:9.3f}   of {m.hbm_bytes / GIB:.2f}{per_chip}",
    ]
    if m.host_temp_bytes:
        lines.append(f"  offloaded to host memory         {m.host_temp_bytes / GIB:9.3f}")
    if m.largest_allocations:
        lines += ["  largest buffers:", *(f"    {a}" for a in m.largest_allocations[:3])]
    return lines


def _collectives(r: PlanReport) -> list[str]:
    lines = ["", "collectives per step         count   MiB sent per device"]
    for c in r.collectives:
        dcn = f"  ({c.dcn_bytes_sent_per_chip / MIB:.1f} over DCN)" if c.dcn_bytes_sent_per_chip else ""
        lines.append(f"  {c.kind:25s} {c.count:7d}   {c.bytes_sent_per_chip / MIB:12.1f}{dcn}")
    return lines


def _context(r: PlanReport) -> list[str]:
    c = r.context_parallel
    if c is None:
        return []
    kv = c.kv_bytes_per_layer
    lines = [
        "",
        f"context parallelism: {c.axis}={c.size}, {c.tokens_per_shard} of {r.seq_len} tokens a shard (load-balanced: "
        f"chunks i and {2 * c.size - 1}-i of {2 * c.size}); parameters over {Role.FSDP.value} x {c.axis}",
        f"  K and V of each of {c.layers} layers all-gathered over {c.axis}: {kv / MIB:.1f} MiB each a device, "
        f"{(c.size - 1) * kv / c.size / MIB:.1f} MiB sent (their gradients reduce-scattered in backward)",
        f"  collectives over the {c.axis} group alone    count   MiB sent per device",
    ]
    lines += [f"    {k.kind:25s} {k.count:9d}   {k.bytes_sent_per_chip / MIB:12.1f}" for k in c.collectives]
    return lines


FLOPS_EXPLAINED_ABOVE = 1.35  # a program running more than this x the model's FLOPs says where


def _flops_where(r: PlanReport) -> list[str]:
    """Where the program's FLOPs are, by loop nest, when it runs more than `FLOPS_EXPLAINED_ABOVE` x
    the model's (all of it is in ``--json``: ``estimate.flops_by_loop``, ``estimate.flops_by_op``)."""
    e = r.estimate
    if not e.flops_by_loop or e.hardware_flops_per_device * r.devices <= FLOPS_EXPLAINED_ABOVE * e.model_flops_per_step:
        return []
    lines = ["  where the program's FLOPs are (x the model's per device; --json: estimate.flops_by_op):"]
    for entry in e.flops_by_loop[:4]:
        nest = " > ".join(f"{name} x{trips}" for name, trips in entry["loops"]) or "outside any loop"
        lines.append(f"    {entry['of_model']:5.2f}  {entry['ops']} ops in {nest}")
    return lines


def _cross_slice(r: PlanReport) -> str:
    seconds = r.estimate.predicted_cross_slice_seconds
    if seconds <= 0:
        return ""
    return f" (of which {seconds * 1e3:.1f} ms the {r.slices} slices' waits for each other: docs/plan.md, Calibration)"


def _estimate(r: PlanReport) -> list[str]:
    e = r.estimate
    recompute = f" (x{e.recompute_factor:.2f} recomputation)" if e.recompute_factor != 1.0 else ""
    lines = [
        "",
        f"model FLOPs per step {e.model_flops_per_step:.3e}; XLA cost analysis (loop bodies once): "
        f"{r.xla_flops:.3e} FLOPs, {r.xla_bytes_accessed / GIB:.1f} GiB accessed",
    ]
    if e.predicted:
        lines += [
            f"predicted step (the compiled program: docs/plan.md): {e.predicted_seconds * 1e3:.1f} ms = operations "
            f"{e.predicted_op_seconds * 1e3:.1f} ms + communication not hidden {e.predicted_exposed_seconds * 1e3:.1f} ms"
            + _cross_slice(r),
            f"  -> predicted MFU {e.predicted_mfu:.1%}, {r.predicted_tflops_per_chip:.0f} TFLOP/s per chip; "
            f"the program runs {e.hardware_flops_per_device * r.devices / e.model_flops_per_step:.2f} x the model's FLOPs",
        ]
        lines += _flops_where(r)
    lines += [
        f"bound (roofline): compute {e.compute_seconds * 1e3:.1f} ms{recompute}, ICI {e.ici_seconds * 1e3:.1f} ms, "
        f"DCN {e.dcn_seconds * 1e3:.1f} ms",
        f"  -> step {e.step_seconds_overlapped * 1e3:.1f} ms (communication hidden) .. "
        f"{e.step_seconds_serial * 1e3:.1f} ms (none hidden)",
        f"  -> MFU bound {e.mfu_serial:.1%} (none hidden) .. {e.mfu_overlapped:.1%} (hidden)",
    ]
    return lines


def plan_table(r: PlanReport) -> str:
    """The report as text: heading, memory, collectives, estimate (and a published run of the
    model on as many chips, beside it), verdict."""
    lines = _heading(r) + _memory(r)
    if r.memory.compiler_oom_bytes is not None:
        lines += ["", "no collectives or step estimate: the compiler stopped at memory assignment"]
    else:
        lines += _collectives(r) + _context(r) + _estimate(r)
        published = published_for(r.model, r.chip, r.chips, r.seq_len, r.slices, r.strategy)
        lines += [f"  published: {published.line()}"] if published else []
    return "\n".join(lines + ["", r.verdict()])
