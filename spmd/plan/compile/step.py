"""Compile a lowered step with libtpu's compiler and read what it says: per-device memory, the
optimized HLO (for the collectives), the cost analysis, or the compiler's own out-of-memory.

When a program does not fit, libtpu refuses it ("Ran out of memory in memory space hbm. Used
45.97G of 15.75G hbm") and lists its largest buffers; that refusal is a result (an OOM plan), not
an error. Any other compile failure propagates.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spmd.plan._jax_compat import compile_with_hlo
from spmd.plan.errors import PlanError

__all__ = ["CompiledStep", "compile_step", "largest_buffers", "oom_used_bytes", "report_buffers", "vmem_refusal"]

_UNITS = {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class CompiledStep:
    """What the compiler gave: its memory analysis (as a dict of ``*_in_bytes`` fields), the
    optimized HLO text and cost analysis, and its largest buffers; or, for a program that does not
    fit, the usage and largest buffers its error names. ``seconds``: the compile's wall time."""

    seconds: float
    memory: dict[str, int] = field(default_factory=dict)
    hlo_text: str = ""
    cost: dict[str, float] = field(default_factory=dict)
    oom_bytes: int | None = None
    oom_temporaries_only: bool = False
    largest: tuple[str, ...] = ()

    @property
    def fits_compiler(self) -> bool:
        return self.oom_bytes is None


def oom_used_bytes(message: str) -> int | None:
    """The usage libtpu's out-of-memory error gives: "Ran out of memory in memory space hbm. Used
    45.97G of 15.75G hbm" (libtpu 0.0.20: the whole program), or "the total memory required for
    HLO temporaries (350.41G) exceeds available HBM (94.74G)" (libtpu 0.0.52: temporaries only;
    `oom_counts_temporaries_only`)."""
    found = re.search(r"Used ([\d.]+)([BKMGT]) of ([\d.]+)([BKMGT]) hbm", message) or re.search(
        r"required for HLO temporaries \(([\d.]+)([BKMGT])\) exceeds available HBM", message
    )
    return None if found is None else int(float(found[1]) * _UNITS[found[2]])


def vmem_refusal(message: str) -> PlanError | None:
    """libtpu's refusal of a Pallas kernel whose tiles do not fit the core's vector memory ("Ran
    out of memory in memory space vmem. Used 287.21M of 128.00M vmem", the kernel named on an "XLA
    label" line), or the scoped part of it a kernel may take ("Scoped allocation with size 33.74M
    and limit 32.00M exceeded scoped vmem limit"), as a `PlanError` naming the fix; ``None`` for
    any other error. The planner's Pallas kernels are splash attention's, whose tiles are its block
    sizes (``--splash-blocks``)."""
    scoped = re.search(r"Scoped allocation with size ([\d.]+[BKMGT]) and limit ([\d.]+[BKMGT]) exceeded", message)
    if scoped is not None:
        kernel = re.search(r"allocating on stack for %(\S+) = ", message)
        return PlanError(
            f"libtpu cannot fit {kernel[1] if kernel else 'a Pallas kernel'} in the scoped vector memory (VMEM) a "
            f"kernel may take: it needs {scoped[1]}B of {scoped[2]}B. Raise the limit with --scoped-vmem-kib "
            "(MaxText's Trillium recipes give 98304), or give smaller --splash-blocks."
        )
    found = re.search(r"Used ([\d.]+[BKMGT]) of ([\d.]+[BKMGT]) vmem", message)
    if found is None:
        return None
    kernel = re.search(r"XLA label: (\S+) = ", message)
    return PlanError(
        f"libtpu cannot fit {kernel[1] if kernel else 'a Pallas kernel'} in the core's vector memory (VMEM): its "
        f"tiles need {found[1]}B of {found[2]}B. The splash kernel's tiles are its block sizes: give smaller "
        "--splash-blocks (MaxText's recipes use 512 to 2048), or leave them out."
    )


def oom_counts_temporaries_only(message: str) -> bool:
    """libtpu 0.0.52's form of the error, which leaves the arguments out (`oom_used_bytes`)."""
    return "required for HLO temporaries" in message


def largest_buffers(message: str, top: int = 5) -> tuple[str, ...]:
    """The compiler's largest buffers, one line each: size, shape, operation."""
    found = re.findall(r"Size: ([\d.]+\w)\s+Operator: op_name=\"([^\"]*)\"\s+Shape: (\S+)", message)
    return tuple(f"{size:>8s}  {shape}  ({op})" for size, op, shape in found[:top])


_REPORT_LINE = re.compile(r"^\s*[\d.]+\w+\(\s*\d+%\);\s*([\d.]+)(\w*)B;\s*\d+;\s*\d+;\s*(.*)$")


def report_buffers(report: str, top: int = 5) -> tuple[str, ...]:
    """The largest HBM buffers of libtpu's memory-usage report (one line each: size, the shapes it
    holds), largest first. The report lists HBM first, then on-chip memories (VMEM), where the
    compiler puts what fits there: those count in no HBM figure."""
    found = []
    default = report.split("\nMemory Space:", 1)[0]  # HBM (color 0) comes first; others are on-chip memories
    for line in default.splitlines():
        m = _REPORT_LINE.match(line)
        if m:
            size = float(m.group(1)) * _UNITS.get(m.group(2)[:1].upper() or "B", 1)
            found.append((size, f"{m.group(1)}{m.group(2)}B", m.group(3).strip()))
    found.sort(key=lambda t: -t[0])
    return tuple(f"{text:>10s}  {shapes[:160]}" for _, text, shapes in found[:top])


def _memory_fields(stats: Any) -> dict[str, int]:
    """Every ``*_in_bytes`` figure of ``compiled.memory_analysis()`` (host ones included)."""
    return {k: int(getattr(stats, k)) for k in dir(stats) if k.endswith("_in_bytes") and not k.startswith("_")}


def compile_step(lowered: Any, options: Mapping[str, Any] | None = None) -> CompiledStep:
    """Compile ``lowered`` with libtpu's ``options`` (`PlanSettings.compiler_options`; module docstring)."""
    start = time.perf_counter()
    try:
        compiled, hlo, report = compile_with_hlo(lowered, options)
    except Exception as e:  # jaxlib's XlaRuntimeError; only the compiler's own OOM is a result
        used = oom_used_bytes(str(e))
        refusal = vmem_refusal(str(e))
        if refusal is not None:
            raise refusal from None
        if "RESOURCE_EXHAUSTED" not in str(e) or used is None:
            raise
        seconds, text = time.perf_counter() - start, str(e)
        return CompiledStep(
            seconds,
            oom_bytes=used,
            oom_temporaries_only=oom_counts_temporaries_only(text),
            largest=largest_buffers(text),
        )
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    numbers = {k: float(v) for k, v in cost.items() if k in ("flops", "bytes accessed")}
    return CompiledStep(
        seconds, _memory_fields(compiled.memory_analysis()), hlo, numbers, largest=report_buffers(report)
    )
