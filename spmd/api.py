"""torch_xla's ``torch_xla.distributed.spmd.api`` (its DTensor-style helpers), re-exported.

``xla_distribute_tensor``, ``xla_distribute_module``, ``auto_policy``, ``convert_to_xla_mesh``
and ``convert_to_xla_partition_spec`` are torch_xla's own objects, imported on first use, so
``from torch_xla.distributed.spmd.api import ...`` becomes ``from spmd.api import ...``.
"""

from __future__ import annotations

import importlib
from typing import Any

TORCH_XLA_NAMES = (
    "auto_policy",
    "convert_to_xla_mesh",
    "convert_to_xla_partition_spec",
    "xla_distribute_module",
    "xla_distribute_tensor",
)
__all__ = [*TORCH_XLA_NAMES]


def __getattr__(name: str) -> Any:
    if name in TORCH_XLA_NAMES:
        return getattr(importlib.import_module("torch_xla.distributed.spmd.api"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
