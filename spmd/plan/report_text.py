"""A `PlanReport` as the table ``python -m spmd.plan`` prints, one section per function."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spmd.plan.published import published_for

if TYPE_CHECKING:
    from spmd.plan.report import PlanReport

__all__ = ["plan_table"]

MIB = 2**20
GIB = 2**30


def _heading(r: PlanReport) -> list[str]:
    mesh = " x ".join(f"{k}={v}" for k, v in r.mesh.items())
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
        + (f" ({r.splash_kernels} splash kernels)" if r.splash_kernels else ""),
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
        f"  outputs - aliased                {(m.output_bytes - m.alias_bytes) / GIB:9.3f}",
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


def _estimate(r: PlanReport) -> list[str]:
    e = r.estimate
    recompute = f" (x{e.recompute_factor:.2f} recomputation)" if e.recompute_factor != 1.0 else ""
    return [
        "",
        f"model FLOPs per step {e.model_flops_per_step:.3e}; XLA cost analysis (loop bodies once): "
        f"{r.xla_flops:.3e} FLOPs, {r.xla_bytes_accessed / GIB:.1f} GiB accessed",
        f"estimated step: compute {e.compute_seconds * 1e3:.1f} ms{recompute}, ICI {e.ici_seconds * 1e3:.1f} ms, "
        f"DCN {e.dcn_seconds * 1e3:.1f} ms",
        f"  -> step {e.step_seconds_overlapped * 1e3:.1f} ms (communication hidden) .. "
        f"{e.step_seconds_serial * 1e3:.1f} ms (none hidden)",
        f"  -> roofline MFU bound {e.mfu_serial:.1%} (none hidden) .. {e.mfu_overlapped:.1%} (hidden); "
        "measured runs reach 40-70 % of peak (docs/plan.md)",
    ]


def plan_table(r: PlanReport) -> str:
    """The report as text: heading, memory, collectives, estimate (and a published run of the
    model on as many chips, beside it), verdict."""
    lines = _heading(r) + _memory(r)
    if r.memory.compiler_oom_bytes is not None:
        lines += ["", "no collectives or step estimate: the compiler stopped at memory assignment"]
    else:
        lines += _collectives(r) + _estimate(r)
        published = published_for(r.model, r.chip, r.chips)
        lines += [f"  published: {published.line()}"] if published else []
    return "\n".join(lines + ["", r.verdict()])
