"""The planner's fifth stage, the report: `PlanReport` (per-device memory from the TPU compiler,
collectives, FLOPs, the predicted step time and MFU, what compiled it, the verdict) as a value,
a table and JSON (`plan_report`), and as PNG plots (`plot`).

``spmd.plan.report`` was one module before the planner was grouped by stage: its names are
still here.
"""

from spmd.plan.report.plan_report import (
    CollectiveSummary,
    ContextReport,
    MemoryReport,
    PlanReport,
    StepEstimate,
    plan_table,
    summarize,
)

__all__ = [
    "CollectiveSummary", "ContextReport", "MemoryReport", "PlanReport", "StepEstimate", "plan_table", "summarize",
]  # fmt: skip
