"""SPMD sharding for PyTorch on XLA devices: partition specs, named shardings, `mark_sharding`,
DTensor's vocabulary on either backend, and tools.

``spmd.__all__`` is the product's own vocabulary, re-exported from where it lives:
`spmd.sharding` (the values and the sharding math), `spmd.multiprocess` (global batches, data
loaders, process groups, hang reports) and the verbs on tensors. Exceptions live in
`spmd.errors`. Importing ``spmd`` does not start the XLA runtime; call
`configure_default_devices` first if you want virtual CPU devices.

``import spmd as xs`` stands in for ``import torch_xla.distributed.spmd as xs``: every name of
torch_xla's module resolves here, from `spmd.compat`, where it lives (docs/migration.md).
"""

import sys
import warnings
from typing import Any

from mesh import follow_global_mesh
from mesh import get_global_mesh as get_global_mesh
from mesh import set_global_mesh as set_global_mesh
from mesh import use_mesh as use_mesh
from spmd import _moved, errors
from spmd._backend import BACKENDS as BACKENDS
from spmd._backend import ShardingBackend as ShardingBackend
from spmd._backend import backend_for as backend_for
from spmd._backend import use_backend as use_backend
from spmd.barrier import optimization_barrier as optimization_barrier
from spmd.devices import configure_default_devices as configure_default_devices
from spmd.devices import enable_spmd as enable_spmd
from spmd.distribute import device_count as device_count
from spmd.distribute import device_mesh as device_mesh
from spmd.distribute import distribute_module as distribute_module
from spmd.distribute import distribute_tensor as distribute_tensor
from spmd.distribute import init_device_mesh as init_device_mesh
from spmd.distribute import step as step
from spmd.layer_norm import ShardableLayerNorm as ShardableLayerNorm
from spmd.layer_norm import layer_norm as layer_norm
from spmd.layer_norm import use_shardable_layer_norm as use_shardable_layer_norm
from spmd.manual import disable_manual_sharding as disable_manual_sharding
from spmd.manual import enable_manual_sharding as enable_manual_sharding
from spmd.mark_sharding import clear_sharding as clear_sharding
from spmd.mark_sharding import get_sharding as get_sharding
from spmd.mark_sharding import mark_sharding as mark_sharding
from spmd.mark_sharding import mark_sharding_with_gradients as mark_sharding_with_gradients
from spmd.mark_sharding import with_sharding_constraint as with_sharding_constraint
from spmd.multiprocess import DataPosition as DataPosition
from spmd.multiprocess import ProcessDataLoader as ProcessDataLoader
from spmd.multiprocess import ProcessSampler as ProcessSampler
from spmd.multiprocess import init_process_group as init_process_group
from spmd.multiprocess import make_global_batch as make_global_batch
from spmd.multiprocess import make_global_tensor as make_global_tensor
from spmd.multiprocess import process_rows as process_rows
from spmd.multiprocess import watch_collectives as watch_collectives
from spmd.parameters import shard_parameters as shard_parameters
from spmd.sharded_tensor import ShardedTensor as ShardedTensor
from spmd.sharding import HloSharding as HloSharding
from spmd.sharding import NamedSharding as NamedSharding
from spmd.sharding import P as P
from spmd.sharding import PartitionSpec as PartitionSpec
from spmd.sharding import ShardBounds as ShardBounds
from spmd.sharding import ShardingKind as ShardingKind
from spmd.sharding import hlo_sharding_for as hlo_sharding_for
from spmd.sharding import placements_from_spec as placements_from_spec
from spmd.sharding import resolve_spec as resolve_spec
from spmd.sharding import spec_from_placements as spec_from_placements
from spmd.visualize import visualize_sharding as visualize_sharding

_moved.install()

from spmd import compat  # noqa: E402 (after the hook: compat's modules import moved paths' users)
from spmd.compat.xla_mesh import TorchXlaGlobalMesh  # noqa: E402
from spmd.context import context_parallel as context_parallel  # noqa: E402

__all__ = [
    # values and sharding math (spmd.sharding)
    "HloSharding",
    "NamedSharding",
    "P",
    "PartitionSpec",
    "ShardBounds",
    "ShardingKind",
    "hlo_sharding_for",
    "placements_from_spec",
    "resolve_spec",
    "spec_from_placements",
    # the global mesh (mesh)
    "get_global_mesh",
    "set_global_mesh",
    "use_mesh",
    # verbs on tensors and modules
    "ShardedTensor",
    "clear_sharding",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "get_sharding",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "optimization_barrier",
    "shard_parameters",
    "visualize_sharding",
    "with_sharding_constraint",
    "ShardableLayerNorm",
    "layer_norm",
    "use_shardable_layer_norm",
    # devices and backends
    "configure_default_devices",
    "enable_spmd",
    "backend_for",
    "use_backend",
    # DTensor's vocabulary, on either backend
    "device_count",
    "device_mesh",
    "distribute_module",
    "distribute_tensor",
    "init_device_mesh",
    "step",
    # across processes (spmd.multiprocess)
    "DataPosition",
    "ProcessDataLoader",
    "ProcessSampler",
    "init_process_group",
    "make_global_batch",
    "make_global_tensor",
    "process_rows",
    "watch_collectives",
    # the sequence split over a mesh axis (spmd.context)
    "context_parallel",
]

# torch_xla's submodule paths keep importing (``import spmd.xla_sharding``), from spmd.compat.
for _name in compat.OLD_PATHS:
    sys.modules[f"{__name__}.{_name}"] = getattr(compat, _name)

# torch_xla's global mesh follows ours (its FSDPv2 and the Hugging Face Trainer read it).
follow_global_mesh(TorchXlaGlobalMesh())

# Names that were in ``spmd.__all__`` and live elsewhere now; they still resolve here.
_MOVED_MODULE_ATTRS = {old.rpartition(".")[2]: old for old in _moved.MOVED_MODULES}
# torch_xla's objects in ``spmd.__all__`` until round 4 (where torch_xla is installed), which
# torch_xla's own ``torch_xla.distributed.spmd`` does not list: they live in spmd.compat.xla_sharding.
_DROPPED_TORCH_XLA = ("EinsumLinear", "apply_xla_patch_to_nn_linear")


def __getattr__(name: str) -> Any:
    # torch_xla's names (and modules): ``xs.Mesh``, ``xs.XLAShardedTensor``, ``xs.api`` ...
    if name in compat.__all__ or name in compat.TORCH_XLA_NAMES:
        return getattr(compat, name)
    if name in errors.__all__:
        return getattr(errors, name)
    if name in _MOVED_MODULE_ATTRS:  # ``spmd.sharding`` as an attribute: the old module path
        import importlib

        return importlib.import_module(_MOVED_MODULE_ATTRS[name])
    if name in _DROPPED_TORCH_XLA:
        where = ".".join(compat.xla_sharding.TORCH_XLA_REEXPORTS[name])
        warnings.warn(
            f"spmd.{name} is torch_xla's {where}; import it from spmd.compat.xla_sharding (or from torch_xla)",
            DeprecationWarning,
            stacklevel=2,
        )
        return compat.xla_sharding.reexported(name)
    if name == "Shard":
        warnings.warn(
            "spmd.Shard is torch_xla's shard record, spelled spmd.compat.XLAShard (spmd.XLAShard); "
            "the placement mark_sharding takes is torch.distributed.tensor.Shard(dim)",
            DeprecationWarning,
            stacklevel=2,
        )
        return compat.XLAShard
    raise AttributeError(f"module 'spmd' has no attribute {name!r}")
