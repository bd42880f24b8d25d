"""Bytes: the units, their text, and one device's memory at a step's peak by category (pure
Python). The inspector's two captures fill the same record: torch_xla's from XLA's buffer
assignment (arguments, outputs, temporaries), the dry run's from torch's memory tracker
(parameters, gradients, optimizer state, activations... at the peak, and each one's maximum).

The planner reads the TPU compiler's ``memory_analysis()`` into the same record
(`MemoryUsage.from_memory_analysis`; its report, `spmd.plan.report.MemoryReport`, is a
`MemoryUsage` judged against the device's memory budget). Its own math before compiling is a
prediction, not a record of a compiled step (`spmd.plan.predict.memory.MemoryMath`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from mesh.checks import is_real

__all__ = ["GIB", "KIB", "MIB", "Allocation", "MemoryUsage", "format_bytes"]

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def format_bytes(n: int | float) -> str:
    """``1536`` -> ``'1.50 KiB'``.

    Raises:
        TypeError: ``n`` is not a number.
    """
    if not is_real(n):
        raise TypeError(f"format_bytes takes a number of bytes, got {type(n).__name__} {n!r:.60}.")
    value = float(n)
    if not math.isfinite(value):
        return f"{value} B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < KIB or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= KIB
    raise AssertionError("unreachable")


_ALLOC_RE = re.compile(r"^allocation (?P<index>\d+): size (?P<size>\d+), ?(?P<tags>.*?):?\s*$")
_TOTAL_RE = re.compile(r"^Total bytes used: (?P<total>\d+)")


@dataclass(frozen=True)
class Allocation:
    """One buffer of the executable.

    Attributes:
        index: XLA's allocation number.
        size: bytes.
        parameter: the entry parameter it holds, if any.
        live_out: whether it may hold an output.
        temp: whether it is the preallocated temporary buffer (or another temporary).
        thread_local: scalars of nested computations (reducers), held in registers or stack.
    """

    index: int
    size: int
    parameter: int | None
    live_out: bool
    temp: bool
    thread_local: bool


@dataclass(frozen=True)
class MemoryUsage:
    """One device's memory for a compiled step or a step of a run, by category of bytes.

    XLA's buffer assignment fills the kinds of buffer (``argument_bytes`` ... ``allocations``);
    torch's memory tracker (the dry run) fills ``at_peak`` and ``category_max`` with its
    categories (``sharded_parameters``, ``optimizer_state``, ``activations``...). ``peak_bytes``
    is the step's peak either way.

    Attributes:
        peak_bytes: the most the device holds at once: XLA's "Total bytes used" (all
            allocations together), or the tracker's peak within the step.
        argument_bytes: the parameters (weights, optimizer state, inputs), per device.
        output_bytes: outputs not aliased to a parameter.
        alias_bytes: outputs written into a parameter's buffer (donated), counted once in
            ``argument_bytes``.
        temp_bytes: temporaries at their peak (activations kept for backward, gathered
            weights, gradients in flight).
        allocations: every allocation of XLA's buffer assignment, for a closer look.
        at_peak: bytes per category at the peak.
        category_max: each category's own maximum over the step.
        generated_code_bytes: the executable's code (the TPU compiler reports it).
        host_temp_bytes: temporaries kept in the host's memory (offloaded activations).
    """

    peak_bytes: int
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_bytes: int = 0
    allocations: tuple[Allocation, ...] = ()
    at_peak: Mapping[str, int] = field(default_factory=dict)
    category_max: Mapping[str, int] = field(default_factory=dict)
    generated_code_bytes: int = 0
    host_temp_bytes: int = 0

    @classmethod
    def from_memory_analysis(cls, stats: Mapping[str, int], **more: object) -> MemoryUsage:
        """From a compiled executable's ``memory_analysis()`` as a dict of its ``*_in_bytes``
        fields (jax's ``CompiledMemoryStats``): the compiler counts aliased outputs in its output
        size, which this record keeps apart, so the peak is arguments + outputs not aliased +
        temporaries. ``more``: the fields a subclass adds.

        Raises:
            KeyError: ``stats`` lacks one of the argument, output, alias or temp sizes.
        """
        argument, alias = stats["argument_size_in_bytes"], stats["alias_size_in_bytes"]
        output, temp = stats["output_size_in_bytes"] - alias, stats["temp_size_in_bytes"]
        return cls(
            argument + output + temp,
            argument_bytes=argument,
            output_bytes=output,
            alias_bytes=alias,
            temp_bytes=temp,
            generated_code_bytes=stats.get("generated_code_size_in_bytes", 0),
            host_temp_bytes=stats.get("host_temp_size_in_bytes", 0),
            **more,  # type: ignore[arg-type]
        )

    @classmethod
    def parse(cls, buffer_assignment_text: str) -> MemoryUsage:
        """From the text of XLA's ``*after_optimizations-buffer-assignment.txt``.

        Raises:
            TypeError: the text is not a string.
            ValueError: the text has no allocations or no "Total bytes used" line.
        """
        if not isinstance(buffer_assignment_text, str):
            raise TypeError(
                f"MemoryUsage.parse takes the dump's text (a str), got {type(buffer_assignment_text).__name__}."
            )
        allocations: list[Allocation] = []
        total: int | None = None
        for line in buffer_assignment_text.splitlines():
            m = _ALLOC_RE.match(line)
            if m:
                tags = m.group("tags")
                param = re.search(r"\bparameter (\d+)", tags)
                allocations.append(
                    Allocation(
                        index=int(m.group("index")),
                        size=int(m.group("size")),
                        parameter=int(param.group(1)) if param else None,
                        live_out="maybe-live-out" in tags,
                        temp="preallocated-temp" in tags,
                        thread_local="thread-local" in tags,
                    )
                )
                continue
            t = _TOTAL_RE.match(line)
            if t and total is None:
                total = int(t.group("total"))
        if total is None or not allocations:
            raise ValueError("No allocations or no 'Total bytes used' line: not an XLA buffer assignment dump.")
        argument = sum(a.size for a in allocations if a.parameter is not None)
        alias = sum(a.size for a in allocations if a.parameter is not None and a.live_out)
        output = sum(a.size for a in allocations if a.parameter is None and a.live_out)
        temp = sum(a.size for a in allocations if a.parameter is None and not a.live_out and not a.thread_local)
        return cls(total, argument, output, alias, temp, tuple(allocations))
