"""The torch_xla backend: every call of a private ``torch_xla._XLAC`` binding lives here.

`TorchXlaBackend` (`backend`) implements the `ShardingBackend` protocol (GSPMD annotations on
lazy tensors). `XLAShardedTensor` (`sharded_tensor`; a ``DTensor`` subclass, with its
`dtensor_spec`, `local_shards` and torch_xla's `wrapping` helpers) is what `mark_sharding`
returns on this runtime. The functions are the torch_xla-only operations the rest of the product needs beyond the
protocol: the runtime (`runtime`: the import gate, SPMD mode, devices, steps, named graphs, the
global mesh, barriers) and shardings (`shardings`: our `HloSharding` to torch_xla's
``OpSharding`` and back, local shards, manual sharding). Everything else speaks `HloSharding`.
Only these modules import torch_xla, and only when called.
"""

from spmd._backend.torch_xla_backend.backend import TorchXlaBackend
from spmd._backend.torch_xla_backend.linear import einsum_linear
from spmd._backend.torch_xla_backend.runtime import (
    checkpoint,
    compile_count,
    device_attributes,
    device_count,
    device_kind,
    ensure_spmd,
    global_mesh,
    is_pending,
    is_xla_tensor,
    mirror_global_mesh,
    optimization_barrier_,
    platform,
    push_scope,
    require_torch_xla,
    shard_alike,
    step_functions,
    sync,
    sync_named,
    sync_tensors,
    tensors_hlo_text,
    torch_xla_module,
)
from spmd._backend.torch_xla_backend.shardings import (
    MAX_TILED_RANK,
    attach_sharding,
    attach_sharding_constraint,
    clear_sharding,
    device_id,
    from_cpu_shards,
    full_to_shard_shape,
    load_local_shards,
    local_shard_devices,
    local_shards,
    mark_manual_sharding,
    op_sharding,
    reshard_in_graph,
    shard_to_full_shape,
    sharding_args,
    sharding_of,
    sharding_text,
    sharding_type,
    to_device_sharded,
    xla_sharding_spec,
)

__all__ = [
    "TorchXlaBackend",
    "MAX_TILED_RANK",
    "attach_sharding",
    "attach_sharding_constraint",
    "checkpoint",
    "clear_sharding",
    "reshard_in_graph",
    "compile_count",
    "device_attributes",
    "device_count",
    "device_id",
    "device_kind",
    "einsum_linear",
    "ensure_spmd",
    "from_cpu_shards",
    "full_to_shard_shape",
    "global_mesh",
    "is_pending",
    "is_xla_tensor",
    "load_local_shards",
    "local_shard_devices",
    "local_shards",
    "mark_manual_sharding",
    "mirror_global_mesh",
    "op_sharding",
    "optimization_barrier_",
    "platform",
    "push_scope",
    "require_torch_xla",
    "shard_alike",
    "shard_to_full_shape",
    "sharding_args",
    "sharding_of",
    "sharding_text",
    "sharding_type",
    "step_functions",
    "sync",
    "sync_named",
    "sync_tensors",
    "tensors_hlo_text",
    "to_device_sharded",
    "torch_xla_module",
    "xla_sharding_spec",
]
