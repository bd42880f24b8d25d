"""torch_xla's ``torch_xla.distributed.spmd.xla_sharding`` names, from our modules.

Scripts that import from torch_xla's submodule (``from torch_xla.distributed.spmd.xla_sharding
import MarkShardingFunction``) switch by changing ``torch_xla.distributed.spmd`` to ``spmd``.
The model-code helpers of torch_xla that involve no mesh (the einsum ``nn.Linear`` patch) are
torch_xla's own objects, imported on first use; its DTensor-style ``xla_distribute_*`` helpers are
ours (`spmd.compat.api`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from mesh import get_global_mesh, set_global_mesh
from spmd.barrier import apply_backward_optimization_barrier
from spmd.compat.sharding_spec import ShardingSpec
from spmd.compat.xla_mesh import HybridMesh, Mesh, get_1d_mesh
from spmd.manual import disable_manual_sharding, enable_manual_sharding, mark_manual_sharding
from spmd.mark_sharding import (
    MarkShardingFunction,
    annotate_custom_sharding,
    clear_sharding,
    mark_sharding,
    mark_sharding_with_gradients,
    shard_as,
)
from spmd.sharded_tensor import (
    XLAShard,
    XLAShardedTensor,
    unwrap_sharded_tensor,
    wrap_as_sharded_tensor,
    wrap_if_sharded,
)
from spmd.sharding import PartitionSpec, ShardingType

_mark_manual_sharding = mark_manual_sharding

# torch_xla's objects, re-exported as they are: (module, name).
TORCH_XLA_REEXPORTS: dict[str, tuple[str, str]] = {
    "XLAPatchedLinear": ("torch_xla.distributed.spmd.xla_sharding", "XLAPatchedLinear"),
    "xla_patched_nn_linear_forward": ("torch_xla.distributed.spmd.xla_sharding", "xla_patched_nn_linear_forward"),
    "apply_xla_patch_to_nn_linear": ("torch_xla.distributed.spmd.xla_sharding", "apply_xla_patch_to_nn_linear"),
    "EinsumLinear": ("torch_xla.distributed.spmd.xla_sharding", "EinsumLinear"),
}

__all__ = [
    "HybridMesh",
    "MarkShardingFunction",
    "Mesh",
    "PartitionSpec",
    "ShardingSpec",
    "ShardingType",
    "XLAShard",
    "XLAShardedTensor",
    "annotate_custom_sharding",
    "apply_backward_optimization_barrier",
    "clear_sharding",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "get_1d_mesh",
    "get_global_mesh",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "set_global_mesh",
    "shard_as",
    "unwrap_sharded_tensor",
    "wrap_as_sharded_tensor",
    "wrap_if_sharded",
    # torch_xla's own objects exist only where torch_xla is installed (not on the current lane).
    *(TORCH_XLA_REEXPORTS if importlib.util.find_spec("torch_xla") is not None else ()),
]


def reexported(name: str) -> Any:
    """torch_xla's object ``name`` from `TORCH_XLA_REEXPORTS` (imports torch_xla).

    Raises:
        TorchXlaNotInstalledError: torch_xla is not installed.
    """
    from spmd._backend import torch_xla_backend

    module, attr = TORCH_XLA_REEXPORTS[name]
    return getattr(torch_xla_backend.torch_xla_module(module, f"{name} (torch_xla's own object)"), attr)


def __getattr__(name: str) -> Any:
    if name in TORCH_XLA_REEXPORTS:
        return reexported(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
