"""Plan a TPU pod from this machine: compile a model's training step for a real TPU topology
with libtpu's compiler (no TPU needed) and report per-chip HBM, collectives and an estimated MFU.

``python -m spmd.plan llama2-7b --topology v5p-128`` or `plan` in Python; guide: docs/plan.md.
Needs the ``plan`` extra (``jax[tpu]``, ``torchax``).
"""

from spmd.plan.advisor import Advice, advise
from spmd.plan.api import STRATEGIES, PlanError, auto_mesh_shape, plan
from spmd.plan.models import BUILTIN_CONFIGS, ModelSpecError
from spmd.plan.report import PlanReport
from spmd.plan.topology import CHIP_SPECS, TopologyError, TpuSlice, parse_slice

__all__ = [
    "Advice",
    "BUILTIN_CONFIGS",
    "CHIP_SPECS",
    "STRATEGIES",
    "ModelSpecError",
    "PlanError",
    "PlanReport",
    "TopologyError",
    "TpuSlice",
    "advise",
    "auto_mesh_shape",
    "parse_slice",
    "plan",
]
