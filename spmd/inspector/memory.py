"""Per-device memory of a compiled graph, read from XLA's buffer assignment (pure Python).

XLA assigns every value of a compiled program to an allocation; an executable needs all its
allocations at once, and the temporaries share one buffer sized by XLA's heap simulation of
the schedule. So the sum, which XLA prints as "Total bytes used", is the device memory the
program needs at its peak: arguments + outputs + the temporaries' peak. Nothing is estimated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MemoryUsage", "Allocation"]

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
    """A compiled graph's per-device memory, by kind of buffer.

    Attributes:
        peak_bytes: XLA's "Total bytes used": all allocations together.
        argument_bytes: the parameters (weights, optimizer state, inputs), per device.
        output_bytes: outputs not aliased to a parameter.
        alias_bytes: outputs written into a parameter's buffer (donated), counted once in
            ``argument_bytes``.
        temp_bytes: temporaries at their peak (activations kept for backward, gathered
            weights, gradients in flight).
        allocations: every allocation, for a closer look.
    """

    peak_bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    allocations: tuple[Allocation, ...]

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
