"""What differs between the torch releases we run on, in one place.

The torch_xla lane runs torch 2.9 (torch_xla's last release); the current lane runs torch 2.11 to
2.15 (TorchTPU's range). Every difference the product depends on is answered here, so nothing
else asks which torch it is on: by feature detection where the feature can be seen, by release
where only a measured bug tells them apart (measured on 2.9, 2.13 and 2.15):

- ``_StridedShard`` subclasses ``Shard`` in 2.9 but not in 2.15: `is_shard` and `is_strided_shard`.
- ``dist.new_group(ranks, sort_ranks=False)`` exists in 2.13 and 2.15, not in 2.9. Without it every group
  orders its members by rank, so a DeviceMesh whose ids do not increase along an axis gets groups
  whose order differs from the mesh's coordinates, and DTensor's collectives put blocks in the
  wrong places (measured on 2.15: ``full_tensor`` of a correct ``from_local`` comes back with its
  blocks reversed on ``[3, 2, 1, 0]``). `ordered_groups_supported` says whether groups can follow
  the mesh's order; `device_mesh_from_ids` builds such a mesh.
- torch 2.9 redistributes a ``_StridedShard`` DTensor to another split wrongly (measured: from
  ``P(('y', 'x'))`` to ``P('x', 'y')`` on a 2x2 mesh two ranks hold the wrong rows) though its
  way to ``Replicate`` is right; 2.13 and 2.15 do both right. `redistribute` goes through ``Replicate``
  where the direct way is wrong.
- torch 2.9's ``distribute_tensor`` fails (``F.pad`` of a block with an empty dim) when a tensor
  split on several mesh axes gives some device an empty block (shape (1, 3) as ``P('y', 'x')``
  on a 4 x 2 mesh); 2.13 and 2.15 lay it out. `splits_empty_blocks` says whether this torch does.
- TorchTPU (``torch-tpu``, torch 2.11 to 2.15) adds ``torch.tpu.ops.optimization_barrier``:
  `tpu_optimization_barrier` finds it.
- A group from ``dist.new_group`` (which ``DeviceMesh`` calls for each axis of a mesh that is not
  the world) waits 30 minutes in a collective whatever timeout ``init_process_group`` was given
  (measured on 2.9 and 2.15, gloo: a stopped peer hangs the others past 25 s with a 4 s world
  timeout). `group_timeout` reads a group's timeout and `set_group_timeout` changes it (gloo and
  NCCL; public as ``dist.set_timeout`` from 2.15).
- The CPU's flash-attention kernel (``aten._scaled_dot_product_flash_attention_for_cpu`` and its
  backward, 2.9 and 2.15) returns the log-sum-exp that ``scaled_dot_product_attention`` hides:
  context parallelism merges attention over parts of the keys with it. `cpu_flash_attention`
  finds the pair.
- ``DeviceMesh._flatten`` (private, 2.9 and 2.15) makes several axes of a mesh one 1-D mesh, which
  FSDP2 shards over as one (torchtitan's ``dp_shard x cp``); its process group orders its ranks by
  id whatever order the mesh gives them (measured on both). `flatten_device_mesh` calls it.
  FSDP2's HSDP mesh pairs a replicate dim with a shard dim; with a flattened dim among them torch
  2.9 slices the root mesh by the flattened dim's name (torchtitan's way), which 2.15 warns is
  deprecated ("Slicing a flattened dim from root mesh", since 2.11), where the private
  ``DeviceMesh._concatenate`` joins the two meshes instead: `replicate_shard_mesh`.
- torch's flight recorder records gloo collectives too (2.9 and 2.15, ``TORCH_FR_BUFFER_SIZE``);
  2.9 marks a timed-out gloo collective completed, so `flight_record` callers take the last
  entries, not the state; its ``pg_config`` lists the world group only, so `group_ranks` finds
  a group's ranks by name. `flight_record` reads it.

It is also the one home of the private torch symbols the product imports (``torch._subclasses``,
``torch.utils._pytree``, ``torch.distributed.tensor._*``, ``torch.distributed.fsdp._*``,
``torch.distributed._tools``, ``torch.testing._internal`` ...): `PRIVATE_SYMBOLS` names each once,
callers import it from here by that name (``from spmd._util.torch_compat import FakeTensor``), and
it is imported on first use. When a torch release moves one, its test in
tests/test_private_upstream.py fails naming it, and only this table changes.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import pickle
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from spmd._util.private_symbols import PrivateSymbol, resolver

__all__ = [
    "PRIVATE_SYMBOLS",
    "TORCH_VERSION",
    "device_mesh_from_ids",
    "flatten_device_mesh",
    "replicate_shard_mesh",
    "is_shard",
    "is_strided_shard",
    "ordered_groups_supported",
    "redistribute",
    "splits_empty_blocks",
    "strided_shard",
    "tpu_optimization_barrier",
    "group_timeout",
    "set_group_timeout",
    "group_ranks",
    "group_sequence_numbers",
    "flight_record",
    "cpu_flash_attention",
    "clear_dtensor_sharding_caches",
    "device_module_registration",
]


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


TORCH_VERSION: tuple[int, int] = _release(torch.__version__)
"""(major, minor) of the torch in this process, for messages only."""

_FAKE = "torch._subclasses.fake_tensor"
_PYTREE = "torch.utils._pytree"
_FAKE_PG = "torch.testing._internal.distributed.fake_pg"
_MEM_TRACKER = "torch.distributed._tools.mem_tracker"

PRIVATE_SYMBOLS: dict[str, PrivateSymbol] = {
    # fake tensors and dispatch modes (the DTensor dry run, a mesh read under a fake mode)
    "FakeTensor": PrivateSymbol(_FAKE, "FakeTensor"),
    "FakeTensorMode": PrivateSymbol(_FAKE, "FakeTensorMode"),
    "DataDependentOutputException": PrivateSymbol(_FAKE, "DataDependentOutputException"),
    "unset_fake_temporarily": PrivateSymbol(_FAKE, "unset_fake_temporarily"),
    "TorchDispatchMode": PrivateSymbol("torch.utils._python_dispatch", "TorchDispatchMode"),
    # a DataLoader's in-process iterator (the dry run runs worker processes' loading in process)
    "SingleProcessDataLoaderIter": PrivateSymbol("torch.utils.data.dataloader", "_SingleProcessDataLoaderIter"),
    # tensor subclasses: torch's C implementations of "no __torch_function__ / __torch_dispatch__
    # here", the wrapper constructor, and the context that turns subclass dispatch off
    "disabled_torch_function_impl": PrivateSymbol("torch._C", "_disabled_torch_function_impl"),
    "disabled_torch_dispatch_impl": PrivateSymbol("torch._C", "_disabled_torch_dispatch_impl"),
    "make_wrapper_subclass": PrivateSymbol("torch", "Tensor._make_wrapper_subclass"),
    "DisableTorchFunctionSubclass": PrivateSymbol("torch._C", "DisableTorchFunctionSubclass"),
    # tracing and autograd: dynamo's tracing context, the engine that runs backward (a callback at
    # its end), a module's parameters swapped for a call
    "TracingContext": PrivateSymbol("torch._guards", "TracingContext"),
    "autograd_engine": PrivateSymbol("torch.autograd.variable", "Variable._execution_engine"),
    "reparametrize_module": PrivateSymbol("torch.nn.utils.stateless", "_reparametrize_module"),
    # pytrees (no public torch.utils.pytree in 2.9 or 2.15)
    "tree_flatten": PrivateSymbol(_PYTREE, "tree_flatten"),
    "tree_unflatten": PrivateSymbol(_PYTREE, "tree_unflatten"),
    "tree_leaves": PrivateSymbol(_PYTREE, "tree_leaves"),
    "tree_map": PrivateSymbol(_PYTREE, "tree_map"),
    "tree_map_only": PrivateSymbol(_PYTREE, "tree_map_only"),
    # process groups: the fake one of the dry run, a group by name, the flight recorder
    "FakeProcessGroup": PrivateSymbol(_FAKE_PG, "FakeProcessGroup"),
    "FakeStore": PrivateSymbol(_FAKE_PG, "FakeStore"),
    "resolve_process_group": PrivateSymbol("torch.distributed.distributed_c10d", "_resolve_process_group"),
    "default_store": PrivateSymbol("torch.distributed.distributed_c10d", "_get_default_store"),
    "dump_fr_trace": PrivateSymbol("torch._C._distributed_c10d", "_dump_fr_trace"),
    # DTensor's internals
    "StridedShard": PrivateSymbol("torch.distributed.tensor.placement_types", "_StridedShard"),
    "DTensorSpec": PrivateSymbol("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
    "TensorMeta": PrivateSymbol("torch.distributed.tensor._dtensor_spec", "TensorMeta"),
    "ShardingPropagator": PrivateSymbol("torch.distributed.tensor._sharding_prop", "ShardingPropagator"),
    "compute_local_shape_and_global_offset": PrivateSymbol(
        "torch.distributed.tensor._utils", "compute_local_shape_and_global_offset"
    ),
    # the variant that takes a mesh shape and a coordinate instead of a mesh (skip_offset=)
    "local_shape_at_coordinate": PrivateSymbol(
        "torch.distributed.tensor._utils", "_compute_local_shape_and_global_offset"
    ),
    "dtensor_redistribute": PrivateSymbol("torch.distributed.tensor._redistribute"),
    "dtensor_collective_utils": PrivateSymbol("torch.distributed.tensor._collective_utils"),
    # FSDP2's and the composable APIs' internals
    "FSDPParam": PrivateSymbol("torch.distributed.fsdp._fully_shard._fsdp_param", "FSDPParam"),
    "FSDPParamGroup": PrivateSymbol("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup"),
    "composable_checkpoint": PrivateSymbol("torch.distributed._composable", "checkpoint"),
    "composable_state": PrivateSymbol("torch.distributed._composable_state"),
    # the memory trackers (torch.distributed._tools)
    "FSDPMemTracker": PrivateSymbol("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker"),
    "MemTracker": PrivateSymbol(_MEM_TRACKER, "MemTracker"),
    "MemRefType": PrivateSymbol(_MEM_TRACKER, "_MemRefType"),
    "TOTAL_KEY": PrivateSymbol(_MEM_TRACKER, "_TOTAL_KEY"),
}
"""The private torch symbols the product imports, by the name callers import them under."""

__getattr__ = resolver(__name__, PRIVATE_SYMBOLS, f"torch {torch.__version__}")


def is_shard(placement: Any) -> bool:
    """Whether a DTensor placement splits a dim (``Shard`` or ``_StridedShard``)."""
    from torch.distributed.tensor import Shard

    return isinstance(placement, Shard) or is_strided_shard(placement)


def is_strided_shard(placement: Any) -> bool:
    """Whether a DTensor placement is a ``_StridedShard`` (a dim split against mesh order)."""
    return isinstance(placement, __getattr__("StridedShard"))


def strided_shard(dim: int, split_factor: int) -> Any:
    """DTensor's ``_StridedShard(dim, split_factor)``."""
    return __getattr__("StridedShard")(dim, split_factor=split_factor)


@functools.cache
def ordered_groups_supported() -> bool:
    """Whether this torch can make a process group whose members keep the order given
    (``new_group(..., sort_ranks=False)``, torch 2.13 and later; torch 2.9 always sorts them)."""
    import torch.distributed as dist

    return "sort_ranks" in inspect.signature(dist.new_group).parameters


def device_mesh_from_ids(device_type: str, ids: np.ndarray, names: tuple[str, ...]) -> Any:
    """A ``DeviceMesh`` over the ranks ``ids`` (an array shaped like the mesh) whose every axis
    group lists its ranks in mesh-coordinate order, so DTensor's blocks and collectives follow
    the mesh as given, however its ids are permuted.

    Collective: every rank builds every group, in the same order (``new_group`` requires it).
    Needs `ordered_groups_supported`.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    rank = dist.get_rank()
    mine = []
    for axis in range(ids.ndim):
        lines = np.moveaxis(ids, axis, -1).reshape(-1, ids.shape[axis])
        group = None
        for line in lines:
            made = dist.new_group([int(i) for i in line], sort_ranks=False)
            if rank in line:
                group = made
        mine.append(group)
    mesh = torch.as_tensor(ids)
    if ids.ndim == 1:
        return DeviceMesh.from_group(mine[0], device_type, mesh=mesh, mesh_dim_names=names)
    return DeviceMesh.from_group(mine, device_type, mesh=mesh, mesh_dim_names=names)


def flatten_device_mesh(device_mesh: Any, names: tuple[str, ...]) -> Any:
    """The axes ``names`` of ``device_mesh`` (a root DeviceMesh; names in its order) as one 1-D
    DeviceMesh: the axis itself for one, ``DeviceMesh._flatten`` for several, named as torch
    names it (``'fsdp_context'``). Flattening the same axes again returns the same mesh.

    Collective the first time (a new process group), on every rank in the same order. Its group
    orders ranks by id: flatten only axes whose ids increase in mesh order.
    """
    if tuple(device_mesh.mesh_dim_names or ()) == tuple(names):
        return device_mesh if len(names) == 1 else device_mesh._flatten("_".join(names))
    if len(names) == 1:
        return device_mesh[names[0]]
    return device_mesh[tuple(names)]._flatten("_".join(names))


def replicate_shard_mesh(device_mesh: Any, replicate: tuple[str, ...], shard: tuple[str, ...]) -> Any:
    """The 2-D (replicate, shard) DeviceMesh of FSDP2's HSDP: each dim one axis of ``device_mesh``
    (a root DeviceMesh) or several flattened (`flatten_device_mesh`); ``replicate`` before
    ``shard`` in the mesh. Collective as `flatten_device_mesh` is."""
    from torch.distributed.device_mesh import DeviceMesh

    if len(replicate) == 1 and len(shard) == 1:
        return device_mesh[(replicate[0], shard[0])]  # public slicing: no flattening needed
    dims = [flatten_device_mesh(device_mesh, replicate), flatten_device_mesh(device_mesh, shard)]
    concatenate = getattr(DeviceMesh, "_concatenate", None)
    if concatenate is not None:  # 2.15: slicing the root by a flattened name is deprecated there
        return concatenate(dims)
    return device_mesh[tuple(d.mesh_dim_names[0] for d in dims)]


# The oldest releases measured to do these right (2.13 and 2.15 do, 2.9 does not; releases between
# are treated as 2.9 is: the safe way round, or a clear refusal).
_STRIDED_REDISTRIBUTE_EXACT_FROM = (2, 13)
_SPLITS_EMPTY_BLOCKS_FROM = (2, 13)


def splits_empty_blocks() -> bool:
    """Whether DTensor here lays out empty blocks of a tensor split on several mesh axes."""
    return TORCH_VERSION >= _SPLITS_EMPTY_BLOCKS_FROM


def redistribute(t: Any, device_mesh: Any, placements: tuple[Any, ...]) -> Any:
    """``t.redistribute(device_mesh, placements)``, through ``Replicate`` where this torch would
    move a strided shard to the wrong ranks (differentiable either way)."""
    strided = any(is_strided_shard(p) for p in (*t.placements, *placements))
    if strided and TORCH_VERSION < _STRIDED_REDISTRIBUTE_EXACT_FROM:
        from torch.distributed.tensor import Replicate

        t = t.redistribute(t.device_mesh, [Replicate()] * t.device_mesh.ndim)
    return t.redistribute(device_mesh, placements)


def tpu_optimization_barrier() -> Any:
    """TorchTPU's ``torch.tpu.ops.optimization_barrier`` (a list of tensors in, the list to use
    out), or ``None`` where TorchTPU is not loaded (it registers ``torch.tpu`` only on a TPU)."""
    ops = getattr(getattr(torch, "tpu", None), "ops", None)
    return getattr(ops, "optimization_barrier", None)


def group_timeout(group: Any) -> timedelta | None:
    """The collective timeout of process group ``group`` (its first backend's), or ``None``
    where this torch does not say."""
    for device in group._device_types:
        options = getattr(group._get_backend(device), "options", None)
        timeout = getattr(options, "_timeout", None)
        if isinstance(timeout, timedelta):
            return timeout
    return None


def set_group_timeout(group: Any, timeout: timedelta) -> None:
    """Make ``group``'s collectives wait at most ``timeout`` (``dist.set_timeout`` from torch
    2.15; before, the private function it replaced)."""
    import torch.distributed as dist

    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    setter(timeout, group)


def group_sequence_numbers() -> dict[str, int]:
    """How many collectives this process has issued on each of its process groups, by the
    group's name (``ProcessGroup._get_sequence_number_for_group``, 2.9 and 2.15)."""
    import torch.distributed as dist

    out = {}
    for group, name in list(dist.distributed_c10d._world.pg_names.items()):
        try:
            out[name] = int(group._get_sequence_number_for_group())
        except (RuntimeError, AttributeError):  # a group this backend keeps no count for
            continue
    return out


def group_ranks(name: str) -> list[int] | None:
    """The global ranks of the process group named ``name`` (as the flight recorder names it),
    or ``None`` when this process has no such group."""
    import torch.distributed as dist

    for group, group_name in dist.distributed_c10d._world.pg_names.items():
        if group_name == name:
            return dist.get_process_group_ranks(group)
    return None


def flight_record() -> dict[str, Any] | None:
    """torch's flight recorder dump (``entries``: this process's last collectives, oldest
    first; ``pg_config``: each group's ranks), or ``None`` when it records nothing."""
    try:
        record = pickle.loads(__getattr__("dump_fr_trace")())
    except (ImportError, RuntimeError, pickle.UnpicklingError):
        return None
    return record if record.get("entries") else None


@functools.cache
def cpu_flash_attention() -> tuple[Any, Any] | None:
    """``(forward, backward)``: the CPU flash-attention kernels, ``forward(q, k, v, dropout_p,
    is_causal, scale=) -> (out, logsumexp)`` and ``backward(grad_out, q, k, v, out, logsumexp,
    dropout_p, is_causal, scale=) -> (dq, dk, dv)``; ``None`` on a torch without them."""
    ops = torch.ops.aten
    if not hasattr(ops, "_scaled_dot_product_flash_attention_for_cpu"):
        return None
    return (
        ops._scaled_dot_product_flash_attention_for_cpu.default,
        ops._scaled_dot_product_flash_attention_for_cpu_backward.default,
    )


def clear_dtensor_sharding_caches() -> None:
    """Drop DTensor's cached sharding decisions (the Python propagator's, the redistribute
    planner's, the mesh topology's, and from torch 2.10 the C++ dispatch fast path's): they hold
    meshes whose process groups may since have been destroyed."""
    from torch.distributed.tensor import DTensor

    redistribute_module = __getattr__("dtensor_redistribute")
    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    redistribute_module._gen_transform_infos.cache_clear()
    if hasattr(redistribute_module, "clear_redistribute_planner_cache"):
        redistribute_module.clear_redistribute_planner_cache()
    __getattr__("dtensor_collective_utils").MeshTopoInfo.build_from_mesh.cache_clear()
    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:
        clear_native()


@contextlib.contextmanager
def device_module_registration(register: Callable[[Callable[[str, Any], None], str, Any], None]) -> Iterator[None]:
    """Inside: ``torch._register_device_module(name, module)`` calls ``register(original, name,
    module)`` instead (torch's registry of accelerator modules, which torchax's import writes to)."""
    original = torch._register_device_module
    torch._register_device_module = functools.partial(register, original)
    try:
        yield
    finally:
        torch._register_device_module = original
