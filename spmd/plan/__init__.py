"""Plan a TPU pod from this machine: compile a model's training step for a real TPU topology
with libtpu's compiler (no TPU needed) and report per-device HBM, collectives and an estimated MFU.

``python -m spmd.plan llama3.1-70b --topology tpu7x-128`` or `plan` in Python; guide: docs/plan.md.
Needs the ``plan`` extra (torchax, transformers) and a lane's jax and libtpu.
"""

from spmd.plan.advisor import Advice, advise
from spmd.plan.api import STRATEGIES, auto_mesh_shape, plan
from spmd.plan.errors import (
    CompilerVersionError,
    ModelSpecError,
    PlanError,
    StandInReachedError,
    TopologyError,
    TracingError,
)
from spmd.plan.report import PlanReport
from spmd.plan.request import BUILTIN_CONFIGS, CHIP_SPECS, Attention, Remat, TpuSlice, parse_slice

__all__ = [
    "Advice",
    "Attention",
    "BUILTIN_CONFIGS",
    "CHIP_SPECS",
    "STRATEGIES",
    "CompilerVersionError",
    "ModelSpecError",
    "PlanError",
    "PlanReport",
    "Remat",
    "StandInReachedError",
    "TopologyError",
    "TpuSlice",
    "TracingError",
    "advise",
    "auto_mesh_shape",
    "parse_slice",
    "plan",
]
