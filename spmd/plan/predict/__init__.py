"""The planner's fourth stage, the prediction, in one place: what the step costs before and after
it is compiled.

- memory before compiling, from the model's shape alone (`memory.plan_memory`, `MemoryMath`);
- the step time, from the compiled program (`predict_step`: each operation's roofline, the
  collectives on their links, what the schedule overlaps; its constants in `_calibration`, the
  reading of one operation in `_op_costs`), with the model-FLOP roofline beside it as its bound
  (`estimate.estimate_step`, `StepEstimate`);
- the highest MFU a remat policy could reach, before compiling it (`ceiling.mfu_ceiling`);
- the published runs the predictions are held against (`published`).
"""

from spmd.plan.predict._step_time import StepTime, predict_step
from spmd.plan.predict.ceiling import mfu_ceiling
from spmd.plan.predict.estimate import StepEstimate, estimate_step, model_flops
from spmd.plan.predict.memory import MemoryMath, plan_memory
from spmd.plan.predict.published import PUBLISHED, Published, published_for

__all__ = [
    "PUBLISHED",
    "MemoryMath",
    "Published",
    "StepEstimate",
    "StepTime",
    "estimate_step",
    "mfu_ceiling",
    "model_flops",
    "plan_memory",
    "predict_step",
    "published_for",
]
