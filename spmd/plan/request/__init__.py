"""The planner's first stage, the request: what is planned, checked before anything is traced or
compiled.

The TPU slice and its chips (`topology`), the model built on ``meta`` (`models`), the mesh and its
devices (`meshes`; the axes that span slices, `dcn`), each parameter's spec under a strategy
(`specs`), and the step's options, each in one module with what it means for the step: the remat
policy (`remat`, `custom_remat`), attention (`attention`), context parallelism (`context`),
vocabulary tiling (`vocab_tiling`) and fused projections (`fused_projections`). `settings` holds what a plan and every candidate of an advice
share, checked once.
"""

from spmd.plan.request.attention import Attention
from spmd.plan.request.meshes import STRATEGIES, auto_mesh_shape, build_mesh, tpu_devices
from spmd.plan.request.models import BUILTIN_CONFIGS, build_meta_model
from spmd.plan.request.remat import Remat
from spmd.plan.request.settings import PlanSettings
from spmd.plan.request.topology import CHIP_SPECS, ChipSpec, TpuSlice, parse_slice

__all__ = [
    "Attention",
    "BUILTIN_CONFIGS",
    "CHIP_SPECS",
    "ChipSpec",
    "PlanSettings",
    "Remat",
    "STRATEGIES",
    "TpuSlice",
    "auto_mesh_shape",
    "build_mesh",
    "build_meta_model",
    "parse_slice",
    "tpu_devices",
]
