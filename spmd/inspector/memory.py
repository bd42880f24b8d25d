"""Per-device memory of a compiled graph, read from XLA's buffer assignment (pure Python).

XLA assigns every value of a compiled program to an allocation; an executable needs all its
allocations at once, and the temporaries share one buffer sized by XLA's heap simulation of
the schedule. So the sum, which XLA prints as "Total bytes used", is the device memory the
program needs at its peak: arguments + outputs + the temporaries' peak. Nothing is estimated.

`MemoryUsage` is the inspector's one memory record (the dry run fills it from torch's memory
tracker); it lives in `spmd._util.memory`, where the planner can adopt it too.
"""

from spmd._util.memory import Allocation as Allocation
from spmd._util.memory import MemoryUsage as MemoryUsage

__all__ = ["MemoryUsage", "Allocation"]
