"""torch_xla's SPMD surface under our names, apart from the product's own concepts.

``import spmd as xs`` stands in for ``import torch_xla.distributed.spmd as xs``: every name of
torch_xla 2.9's ``torch_xla.distributed.spmd`` lives here (`TORCH_XLA_NAMES`) and resolves on
``spmd`` too, without being in ``spmd.__all__`` unless it is also our own vocabulary
(``mark_sharding``, ``clear_sharding``, ...). The modules here carry torch_xla's submodule names
(``spmd.xla_sharding``, ``spmd.api``, ``spmd.debugging``, ``spmd.sharding_spec``,
``spmd.xla_sharded_tensor`` still import: ``spmd`` registers them under those paths), torch_xla's
mesh methods and runtime defaults (`xla_mesh`), and its DTensor-style helpers (`api`). Each is a
thin layer over the product's own API; docs/migration.md maps each name to ours.
"""

from mesh import get_global_mesh, set_global_mesh
from spmd.barrier import apply_backward_optimization_barrier
from spmd.compat import api, debugging, sharding_spec, xla_mesh, xla_sharded_tensor, xla_sharding
from spmd.compat.api import auto_policy, xla_distribute_module, xla_distribute_tensor
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
from spmd.sharded_tensor import XLAShard, XLAShardedTensor, wrap_if_sharded
from spmd.sharding import ShardingType

# torch_xla's private-looking name, used by its scripts.
_mark_manual_sharding = mark_manual_sharding

# Every name torch_xla 2.9's ``torch_xla.distributed.spmd`` exports (its ``__all__``).
TORCH_XLA_NAMES = (
    "auto_policy",
    "XLAShard",
    "XLAShardedTensor",
    "Mesh",
    "HybridMesh",
    "ShardingType",
    "ShardingSpec",
    "XLAPatchedLinear",
    "MarkShardingFunction",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "shard_as",
    "annotate_custom_sharding",
    "clear_sharding",
    "get_1d_mesh",
    "wrap_if_sharded",
    "xla_distribute_tensor",
    "xla_distribute_module",
    "xla_patched_nn_linear_forward",
    "set_global_mesh",
    "get_global_mesh",
    "_mark_manual_sharding",
    "enable_manual_sharding",
    "disable_manual_sharding",
    "apply_backward_optimization_barrier",
)

__all__ = [
    "HybridMesh",
    "MarkShardingFunction",
    "Mesh",
    "ShardingSpec",
    "ShardingType",
    "XLAShard",
    "XLAShardedTensor",
    "annotate_custom_sharding",
    "api",
    "apply_backward_optimization_barrier",
    "auto_policy",
    "clear_sharding",
    "debugging",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "get_1d_mesh",
    "get_global_mesh",
    "mark_manual_sharding",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "set_global_mesh",
    "shard_as",
    "sharding_spec",
    "wrap_if_sharded",
    "xla_distribute_module",
    "xla_distribute_tensor",
    "xla_mesh",
    "xla_sharded_tensor",
    "xla_sharding",
]

# torch_xla's submodule paths, as they were before this package: ``import spmd.xla_sharding``.
OLD_PATHS = ("api", "debugging", "sharding_spec", "xla_sharded_tensor", "xla_sharding")


def __getattr__(name: str):  # noqa: ANN202 (module __getattr__)
    # torch_xla's own objects (XLAPatchedLinear, ...): only where torch_xla is installed.
    if name in xla_sharding.TORCH_XLA_REEXPORTS:
        return xla_sharding.reexported(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
