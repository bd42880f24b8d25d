"""DTensor's entry points on either backend: `init_device_mesh`, `device_mesh`, `distribute_tensor`,
`distribute_module`.

A script written in DTensor's terms (a ``DeviceMesh``, placements, ``redistribute``,
``full_tensor``) runs unchanged on torch_xla's GSPMD in one process and on ``torch.distributed``
under torchrun: these functions take the backend from the tensors (`spmd.backend_for`), and the
values they return answer DTensor's methods on both (a ``DTensor``; on torch_xla an
`XLAShardedTensor`, which has ``placements``, ``redistribute`` and ``full_tensor``). A mesh
argument may be a ``DeviceMesh``, our `Mesh` or torch_xla's; placements may be a `PartitionSpec`.
``examples/one_script.py`` is such a script.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from mesh import Mesh, MeshTypeError, as_mesh
from spmd._backend import backend_for
from spmd._backend.agreement import agree_on_sharding
from spmd.errors import SpmdTypeError
from spmd.mark_sharding import SpecLike, resolve_sharding
from spmd.parameters import shard_parameters
from spmd.sharding import PartitionSpec

__all__ = ["device_count", "device_mesh", "distribute_module", "distribute_tensor", "init_device_mesh", "step"]

MeshLike = Any  # a Mesh, a torch_xla Mesh, or a torch.distributed DeviceMesh


def device_count() -> int:
    """The devices a mesh covers on the backend in use (torch_xla's devices; torchrun's world)."""
    return backend_for().device_count()


def step() -> None:
    """End a training step on the backend in use: torch_xla runs what it traced
    (``torch_xla.sync()``); DTensor, eager, has nothing to run."""
    backend_for().step()


def device_mesh(mesh: MeshLike) -> Any:
    """``mesh`` as a ``DeviceMesh`` of the backend in use (``xla`` on torch_xla; the process
    groups' device type on DTensor), with its ids, order and axis names."""
    return backend_for().device_mesh(as_mesh(mesh, "device_mesh"))


def init_device_mesh(mesh_shape: int | Sequence[int], mesh_dim_names: Sequence[str] | None = None) -> Any:
    """A ``DeviceMesh`` of ``mesh_shape`` over every device of the backend in use, in id order
    (torch's ``init_device_mesh``, with the device type of the backend). An int is a 1-D shape,
    as `Mesh` takes it.

    Raises:
        MeshError: the shape does not hold the backend's device count.
        MeshTypeError: the shape is not ints, or ``mesh_dim_names`` is a string (not a tuple of
            names: ``'ab'`` would be read as the names ``'a'``, ``'b'``).
    """
    if isinstance(mesh_dim_names, (str, bytes)):
        raise MeshTypeError(
            f"init_device_mesh's mesh_dim_names is a tuple of names, one per mesh axis, e.g. ({mesh_dim_names!r:.60},); "
            f"got the string {mesh_dim_names!r:.60}."
        )
    count = device_count()
    mesh = Mesh(np.arange(count), mesh_shape, None if mesh_dim_names is None else mesh_dim_names)
    return device_mesh(mesh)


def distribute_tensor(
    tensor: torch.Tensor, device_mesh: MeshLike | None = None, placements: SpecLike | Sequence[Any] | None = None
) -> torch.Tensor:
    """A copy of ``tensor`` (every process's same global value, on the host or on the device)
    laid out over ``device_mesh`` as ``placements`` (DTensor's ``Shard(d)``/``Replicate()``, one
    per mesh axis, or a `PartitionSpec`; ``None`` replicates). On torch_xla each device receives
    only its block; the result is an `XLAShardedTensor`. On DTensor, a ``DTensor``.

    Raises:
        ShardingError: the placements or spec do not fit the mesh or the tensor.
        DeviceCountError: the mesh does not use exactly the backend's devices.
    """
    if not isinstance(tensor, torch.Tensor):
        raise SpmdTypeError(f"distribute_tensor takes a torch.Tensor, got {type(tensor).__name__}.")
    backend = backend_for(tensor)
    spec = PartitionSpec() if placements is None else placements
    agree_on_sharding(backend, "distribute_tensor", tensor, device_mesh, spec)
    if tensor.is_meta:  # torch would fail copying it ("Cannot copy out of meta tensor")
        raise SpmdTypeError(f"distribute_tensor: the tensor of shape {tuple(tensor.shape)} is {_META}")
    sharding, hlo = resolve_sharding(tensor, device_mesh, spec, "distribute_tensor", backend, check_tensor=False)
    placed = backend.place(tensor, hlo)
    return backend.shard(placed, sharding, hlo, replace=True)


_META = (
    "on the meta device: a shape but no data to lay out. Materialise it first "
    "(module.to_empty(device=...) then its init), or initialise the model already sharded with "
    "fsdp_xla.deferred (each parameter made on its shards)."
)

PartitionFn = Callable[[str, torch.nn.Module, Any], None]
InputFn = Callable[[torch.nn.Module, Any, Any], Any]
OutputFn = Callable[[torch.nn.Module, Any, Any], Any]


def distribute_module(
    module: torch.nn.Module,
    device_mesh: MeshLike | None = None,
    partition_fn: PartitionFn | None = None,
    input_fn: InputFn | None = None,
    output_fn: OutputFn | None = None,
) -> torch.nn.Module:
    """Move ``module`` to the backend's device and lay its parameters out (torch's
    ``distribute_module``): ``partition_fn(name, submodule, device_mesh)`` for every submodule
    (it shards what it wants, e.g. with `shard_parameters` or `distribute_tensor`); every
    parameter left unsharded is replicated. ``input_fn(module, inputs, device_mesh)`` and
    ``output_fn(module, outputs, device_mesh)`` run around each forward. Returns ``module``.

    Build the optimizer after this call: on DTensor each parameter becomes a new ``DTensor``.

    All or nothing: if ``partition_fn`` (on any submodule) or the final layout raises, every
    parameter and buffer is put back as it was (the same objects, on their device, unsharded)
    before the error propagates, and no hook is registered.
    """
    if not isinstance(module, torch.nn.Module):
        raise SpmdTypeError(f"distribute_module takes an nn.Module, got {type(module).__name__}.")
    for what, fn in (("partition_fn", partition_fn), ("input_fn", input_fn), ("output_fn", output_fn)):
        if fn is not None and not callable(fn):  # checked before the module moves
            raise SpmdTypeError(f"distribute_module's {what} is a function or None, got {fn!r:.80}.")
    meta = [n for n, t in (*module.named_parameters(), *module.named_buffers()) if t.is_meta]
    if meta:  # refused before anything moves: module.to would fail part way, inside torch
        raise SpmdTypeError(
            f"distribute_module: {len(meta)} tensors of {type(module).__name__} ({meta[:3]}) are {_META}"
        )
    first = next(iter(module.parameters()), None)
    backend = backend_for(first if first is not None else torch.empty(0))
    kept = _Snapshot(module, backend)
    try:
        module.to(backend.compute_device())
        if partition_fn is not None:
            for name, sub in list(module.named_modules()):
                partition_fn(name, sub, device_mesh)
        shard_parameters(module, device_mesh, _replicate_the_rest(backend))
    except BaseException:
        kept.restore()
        raise
    if input_fn is not None:
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, device_mesh))
    if output_fn is not None:
        module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, device_mesh))
    return module


def _replicate_the_rest(backend: Any) -> Callable[[str, torch.nn.Parameter], PartitionSpec | None]:
    """Specs for `shard_parameters`: a parameter ``partition_fn`` already laid out keeps its
    layout; every other one is replicated."""

    def spec(name: str, p: torch.nn.Parameter) -> PartitionSpec | None:
        return None if backend.sharding_of(p) is not None else PartitionSpec()

    return spec


class _Snapshot:
    """Every parameter and buffer of a module as it is now (which object sits under each name,
    each tensor's data and device, whether it is sharded), to put back when `distribute_module`
    fails part way: ``module.to`` may move a parameter's data in place or replace the parameter,
    a partition function may replace it (DTensor) or annotate it in place (torch_xla)."""

    def __init__(self, module: torch.nn.Module, backend: Any) -> None:
        self.backend = backend
        self.slots = [(sub, dict(sub._parameters), dict(sub._buffers)) for sub in module.modules()]
        tensors = {id(t): t for _, ps, bs in self.slots for t in (*ps.values(), *bs.values()) if t is not None}
        self.tensors = [(t, t.data, backend.sharding_of(t)) for t in tensors.values()]
        self.grads = [(t, t.grad, t.grad.data) for t in tensors.values() if t.grad is not None]

    def restore(self) -> None:
        for sub, params, buffers in self.slots:
            sub._parameters.clear()
            sub._parameters.update(params)
            sub._buffers.clear()
            sub._buffers.update(buffers)
        for t, data, sharding in self.tensors:
            if sharding is None and self.backend.sharding_of(t) is not None:
                self.backend.clear(t)  # annotated in place (torch_xla) by the partition function
            if t.device != data.device:  # moved in place (``.data`` set) by module.to
                t.data = data
        for t, grad, data in self.grads:
            if grad.device != data.device:
                grad.data = data
            t.grad = grad
