"""SPMD sharding for PyTorch on XLA devices: partition specs, named shardings, `mark_sharding`,
DTensor's vocabulary on either runtime, and tools.

Importing ``spmd`` does not start the XLA runtime; call `configure_default_devices` first
if you want virtual CPU devices. ``import spmd as xs`` stands in for
``import torch_xla.distributed.spmd as xs``: every name of torch_xla's module is here
(`spmd.compat`).
"""

import sys
from typing import Any

from mesh import follow_global_mesh, get_global_mesh, set_global_mesh, use_mesh
from spmd import compat
from spmd._backend import BACKENDS, ShardingBackend, backend_for, use_backend
from spmd.barrier import apply_backward_optimization_barrier, optimization_barrier
from spmd.compat import api, debugging, sharding_spec, xla_sharded_tensor, xla_sharding
from spmd.compat.api import auto_policy, xla_distribute_module, xla_distribute_tensor
from spmd.compat.sharding_spec import ShardingSpec
from spmd.compat.xla_mesh import HybridMesh, Mesh, TorchXlaGlobalMesh, get_1d_mesh
from spmd.data_loader import DataPosition, ProcessDataLoader, ProcessSampler
from spmd.devices import configure_default_devices, enable_spmd
from spmd.distribute import (
    device_count,
    device_mesh,
    distribute_module,
    distribute_tensor,
    init_device_mesh,
    step,
)
from spmd.errors import (
    AxisIndexError,
    CollectiveTimeoutError,
    DataPositionError,
    DeviceCountError,
    DuplicateAxisError,
    HloShardingError,
    IndivisibleBatchError,
    LocalShapeMismatchError,
    MissingSpecError,
    NoMeshError,
    NotAnXlaTensorError,
    PartitionSpecTypeError,
    ProcessDataError,
    RankDisagreementError,
    ShardingConflictError,
    ShardingError,
    ShardLoadError,
    SpecRankError,
    SpmdModeError,
    SpmdTypeError,
    UnknownAxisError,
)
from spmd.hang_report import watch_collectives
from spmd.hlo_sharding import HloSharding, ShardBounds, ShardingKind
from spmd.layer_norm import ShardableLayerNorm, layer_norm, use_shardable_layer_norm
from spmd.manual import disable_manual_sharding, enable_manual_sharding, mark_manual_sharding
from spmd.mark_sharding import (
    MarkShardingFunction,
    annotate_custom_sharding,
    clear_sharding,
    get_sharding,
    mark_sharding,
    mark_sharding_with_gradients,
    shard_as,
    with_sharding_constraint,
)
from spmd.named_sharding import NamedSharding, hlo_sharding_for, resolve_spec
from spmd.parameters import shard_parameters
from spmd.partition_spec import P, PartitionSpec
from spmd.placements import (
    PartialPlacementError,
    PlacementDimError,
    PlacementError,
    placements_from_spec,
    spec_from_placements,
)
from spmd.process_data import make_global_batch, make_global_tensor, process_rows
from spmd.process_group import init_process_group
from spmd.sharded_tensor import Shard, ShardedTensor, XLAShard, XLAShardedTensor, wrap_if_sharded
from spmd.sharding_type import ShardingType
from spmd.visualize import visualize_sharding

__all__ = [
    "AxisIndexError",
    "DeviceCountError",
    "DuplicateAxisError",
    "HloShardingError",
    "HloSharding",
    "HybridMesh",
    "Mesh",
    "NamedSharding",
    "NotAnXlaTensorError",
    "P",
    "PartitionSpec",
    "PartitionSpecTypeError",
    "Shard",
    "ShardBounds",
    "ShardableLayerNorm",
    "ShardedTensor",
    "ShardingConflictError",
    "ShardingError",
    "ShardingKind",
    "SpecRankError",
    "SpmdModeError",
    "UnknownAxisError",
    "XLAShardedTensor",
    "clear_sharding",
    "configure_default_devices",
    "enable_spmd",
    "get_1d_mesh",
    "get_global_mesh",
    "get_sharding",
    "hlo_sharding_for",
    "layer_norm",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "optimization_barrier",
    "resolve_spec",
    "set_global_mesh",
    "shard_parameters",
    "use_mesh",
    "use_shardable_layer_norm",
    "visualize_sharding",
    "with_sharding_constraint",
    "use_backend",
    "backend_for",
    "BACKENDS",
    "ShardingBackend",
    # DTensor's vocabulary, on either runtime
    "PartialPlacementError",
    "PlacementDimError",
    "PlacementError",
    "device_count",
    "device_mesh",
    "distribute_module",
    "distribute_tensor",
    "init_device_mesh",
    "placements_from_spec",
    "spec_from_placements",
    "step",
    "make_global_tensor",
    "make_global_batch",
    "process_rows",
    "ProcessSampler",
    "ProcessDataLoader",
    "DataPosition",
    "ProcessDataError",
    "IndivisibleBatchError",
    "LocalShapeMismatchError",
    "MissingSpecError",
    "DataPositionError",
    "CollectiveTimeoutError",
    "RankDisagreementError",
    "init_process_group",
    "watch_collectives",
    # torch_xla's names (see docs/migration.md)
    "MarkShardingFunction",
    "NoMeshError",
    "ShardLoadError",
    "SpmdTypeError",
    "ShardingSpec",
    "ShardingType",
    "XLAShard",
    "annotate_custom_sharding",
    "apply_backward_optimization_barrier",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "mark_manual_sharding",
    "shard_as",
    "wrap_if_sharded",
    "api",
    "debugging",
    "xla_sharded_tensor",
    "xla_sharding",
    "sharding_spec",
    "compat",
    "auto_policy",
    "xla_distribute_module",
    "xla_distribute_tensor",
    *(name for name in xla_sharding.TORCH_XLA_REEXPORTS if name in xla_sharding.__all__),
]

_mark_manual_sharding = mark_manual_sharding  # torch_xla's private-looking name, used by its scripts

# torch_xla's submodule paths keep importing (``import spmd.xla_sharding``), from spmd.compat.
for _name in compat.OLD_PATHS:
    sys.modules[f"{__name__}.{_name}"] = getattr(compat, _name)

# torch_xla's global mesh follows ours (its FSDPv2 and the Hugging Face Trainer read it).
follow_global_mesh(TorchXlaGlobalMesh())


def __getattr__(name: str) -> Any:
    if name in xla_sharding.TORCH_XLA_REEXPORTS:
        return xla_sharding.reexported(name)
    raise AttributeError(f"module 'spmd' has no attribute {name!r}")
