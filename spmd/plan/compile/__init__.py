"""The planner's third stage: compile the lowered step with libtpu's compiler and read what it
says (`step`: per-device memory, the optimized HLO, the cost analysis, or the compiler's own
out-of-memory), what the compiled program does (`program`: its collectives, loops and splash
kernels), and the same compile for a graph torch_xla dumped (`recompile`).

``spmd.plan.compile`` was one module before the planner was grouped by stage: its names are
still here.
"""

from spmd.plan.compile.step import CompiledStep, compile_step, largest_buffers, oom_used_bytes, report_buffers

__all__ = ["CompiledStep", "compile_step", "largest_buffers", "oom_used_bytes", "report_buffers"]
