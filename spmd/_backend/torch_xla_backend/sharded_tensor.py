"""`XLAShardedTensor`: what `mark_sharding` returns on torch_xla, a tensor that knows its shards.

As torch_xla 2.9's, it is a ``torch.distributed.tensor.DTensor`` subclass: ``isinstance(x,
DTensor)`` holds, and it has DTensor's ``_spec`` (a ``DTensorSpec`` over an ``xla``
``DeviceMesh``), ``placements``, ``device_mesh``, ``redistribute`` and ``full_tensor``. Unlike
torch_xla's it is a *view* of the marked tensor (``t.as_subclass``), not a wrapper holding
another tensor: the same device data and sharding, attached to autograd, usable anywhere a tensor
is, so in-place updates, ``torch_xla._XLAC`` queries and HLO text are those of the marked tensor
itself (torch_xla's wrapper fails backward through its results under functionalization). Ops on
it return `XLAShardedTensor` results while they stay on the XLA device, as torch_xla's do; moving
one off the device (``.cpu()``) gives a plain tensor.

On the DTensor backend `mark_sharding` returns a ``torch.distributed.tensor.DTensor``
instead: the value to keep is always the return value (``x = mark_sharding(x, ...)``), and
`spmd.get_sharding` reads the sharding of either.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from mesh import Mesh
from mesh.checks import require_bool, require_optional_bool
from spmd._backend.torch_xla_backend import runtime, shardings
from spmd._backend.torch_xla_backend.dtensor_spec import dtensor_spec
from spmd._backend.torch_xla_backend.local_shards import load_local_shards, local_shards
from spmd._backend.torch_xla_backend.shard import Shard
from spmd._util.torch_compat import (
    DisableTorchFunctionSubclass,
    TracingContext,
    disabled_torch_dispatch_impl,
    disabled_torch_function_impl,
)
from spmd.errors import ShardLoadError, SpmdTypeError
from spmd.sharding import HloSharding, NamedSharding, PartitionSpec, ShardBounds, ShardingType

__all__ = [
    "Shard",
    "XLAShard",
    "ShardedTensor",
    "XLAShardedTensor",
]


XLAShard = Shard
"""torch_xla's name for `Shard`."""


class XLAShardedTensor(DTensor):
    """A sharded lazy XLA tensor: the marked tensor itself, seen with its sharding; a ``DTensor``.

    Attributes of torch_xla's ``XLAShardedTensor`` (a DTensor there too): `global_tensor`,
    `local_shards`, `load_local_shards_`, `sharding_spec`, `sharding_type`, `mesh_shape`,
    `partition_spec`, `invalidate_spec_cache`; DTensor's `_spec`, `placements`, `device_mesh`,
    `redistribute`, `full_tensor`. Ours: `sharding` (mesh and spec), `hlo_sharding`,
    `global_shape`, `shard_bounds`, `padding`. Build one with `mark_sharding` (or, as torch_xla
    allows, ``XLAShardedTensor(t, mesh_shape, partition_spec, requires_grad=...)``, which only
    records them); ``isinstance(x, XLAShardedTensor)`` holds for its result and for tensors
    computed from it on the device.
    """

    _spmd_marked: torch.Tensor | None
    _spmd_sharding: NamedSharding | None
    _spmd_declared: tuple[Any, Any] | None
    _cached_spec: Any = None  # the DTensorSpec once built (a class default: results of ops pay nothing)

    # Ops never reach DTensor's dispatcher (it would look for a per-process local tensor, which a
    # GSPMD tensor has not: one process holds every device's block). Without a __torch_dispatch__
    # the view's tensor carries no Python dispatch key, and ops run on XLA's kernels directly.
    __torch_dispatch__ = disabled_torch_dispatch_impl

    def __new__(
        cls,
        elem: torch.Tensor,
        mesh_shape: Any = None,
        partition_spec: Any = None,
        *args: Any,
        requires_grad: bool | None = None,
        **kwargs: Any,
    ) -> XLAShardedTensor:
        """torch_xla's constructor: ``elem`` seen as a sharded tensor with the ``mesh_shape`` and
        ``partition_spec`` it records (nothing is laid out; `mark_sharding` does that).

        ``requires_grad=True`` makes the result a leaf that collects its own ``.grad`` (as
        torch_xla's does) when ``elem`` does not require grad; when ``elem`` does, the view stays
        attached and gradients reach ``elem``. ``False`` detaches it; ``None`` (the default)
        keeps ``elem``'s autograd as it is.
        """
        if not isinstance(elem, torch.Tensor):
            raise SpmdTypeError(f"XLAShardedTensor wraps a torch.Tensor, got {type(elem).__name__}.")
        require_optional_bool(requires_grad, "XLAShardedTensor's requires_grad", SpmdTypeError)
        inner = elem.global_tensor if isinstance(elem, XLAShardedTensor) else elem
        if requires_grad is False and inner.requires_grad:
            inner = inner.detach()
        view = cls._view(inner, elem.sharding if isinstance(elem, XLAShardedTensor) else None)
        if requires_grad and not view.requires_grad:
            view.requires_grad_(True)  # a leaf view of a tensor outside autograd: .grad lands here
        if isinstance(elem, XLAShardedTensor):
            view._spmd_declared = elem.__dict__.get("_spmd_declared")
        if mesh_shape is not None or partition_spec is not None:
            view._record(mesh_shape, partition_spec)
        return view

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # everything happens in __new__
        pass

    def _record(self, mesh_shape: Any, partition_spec: Any) -> None:
        """Record torch_xla's constructor arguments (those not given keep their value) and forget
        the cached `_spec`. Checks them: a mesh shape of ints >= 1 and a spec."""
        from mesh.checks import shape_arg

        shape = None if mesh_shape is None else shape_arg(mesh_shape, "XLAShardedTensor's mesh_shape")
        if partition_spec is not None:
            PartitionSpec.from_value(partition_spec)  # raises PartitionSpecTypeError for what is not a spec
        self._spmd_declared = (
            shape if shape is not None else self.mesh_shape,
            partition_spec if partition_spec is not None else self.partition_spec,
        )
        self._cached_spec = None

    @classmethod
    def _view(cls, tensor: torch.Tensor, sharding: NamedSharding | None) -> XLAShardedTensor:
        """A view of ``tensor`` (kept as `global_tensor`) carrying ``sharding``."""
        if type(tensor) is torch.Tensor or isinstance(tensor, torch.nn.Parameter):
            view = torch.Tensor.as_subclass(tensor, cls)
        else:  # a subclass with a __torch_function__ of its own
            with DisableTorchFunctionSubclass():
                view = tensor.as_subclass(cls)
        view._spmd_marked = tensor
        view._spmd_sharding = sharding
        return view

    @property
    def __tensor_flatten__(self) -> Any:
        # A view, not a wrapper: torch.compile must trace it as the tensor it views. DTensor's
        # flatten protocol would hand Dynamo a per-process local tensor that GSPMD does not have;
        # hiding it (hasattr is False) keeps the subclass a plain __torch_function__ one there.
        raise AttributeError("__tensor_flatten__")

    def __getstate__(self) -> dict[str, Any]:
        """Its attributes without the cached DTensorSpec (copy and pickle rebuild it); DTensor's
        slots are not state here: `_spec` is computed and there is no local tensor."""
        return {k: v for k, v in self.__dict__.items() if k != "_cached_spec"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: D105
        # Ops run on the view itself (an autograd- and functionalization-tracked alias of the
        # marked tensor), so C++ code handed the view (torch_xla's FSDPv2 marks outputs with
        # _XLAC calls) and the ops after it see one tensor. Results stay sharded tensors while
        # on the XLA device (torch_xla's behaviour); a host copy is a plain tensor.
        if torch.compiler.is_compiling() or TracingContext.try_get() is not None:
            # Under torch.compile the view is the tensor it views: Dynamo traces the plain op.
            # (Rewrapping here, Dynamo wrapped each rewrapped result again, without end; and it
            # cannot trace the C helper below, so the context manager it knows does the same.)
            with DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        out = _call_as_plain_tensors(func, types, args, kwargs or {})
        if type(out) is torch.Tensor:  # the common case first: one tensor result
            return XLAShardedTensor._view(out, None) if out.device.type == "xla" else out
        if func in _PLAIN_RESULT:
            return out
        return _rewrap(out)

    # torch_xla's attributes -----------------------------------------------------------------
    @property
    def global_tensor(self) -> torch.Tensor:
        """The marked tensor (a plain ``torch.Tensor``; the same object `mark_sharding` got)."""
        marked = self.__dict__.get("_spmd_marked")
        if marked is not None:
            return marked
        with DisableTorchFunctionSubclass():
            return self.as_subclass(torch.Tensor)

    @property
    def sharding_spec(self) -> str:
        """torch_xla's text of the sharding the runtime holds (``''`` when none)."""
        return shardings.sharding_text(self.global_tensor)

    @property
    def sharding_type(self) -> ShardingType | None:
        """The `ShardingType` the runtime holds, or ``None`` when unsharded."""
        value = shardings.sharding_type(self.global_tensor)
        return None if value is None else ShardingType(value)

    @property
    def mesh_shape(self) -> tuple[int, ...] | None:
        """The mesh shape it was marked over (``None`` for a result of an op)."""
        declared = self.__dict__.get("_spmd_declared")
        if declared is not None and declared[0] is not None:
            return tuple(declared[0])
        sharding = self.sharding
        return None if sharding is None else sharding.mesh.mesh_shape

    @property
    def partition_spec(self) -> tuple | None:
        """The spec it was marked with, as a tuple (``None`` for a result of an op)."""
        declared = self.__dict__.get("_spmd_declared")
        if declared is not None and declared[1] is not None:
            return tuple(declared[1])
        sharding = self.sharding
        return None if sharding is None else tuple(sharding.spec)

    @property
    def _spec(self) -> Any:
        """DTensor's layout record (a ``DTensorSpec``): an ``xla`` ``DeviceMesh`` of its mesh (ids,
        order and axis names), its placements and its shape; cached until
        `invalidate_spec_cache`, as torch_xla caches it.

        Raises:
            PlacementError: it has no mesh shape or spec (a result of an op: mark it, or record
                them with `wrap_as_sharded_tensor`). Also a ``ValueError``, as torch_xla raises.
        """
        return self._layout("DTensorSpec not available")

    @property
    def placements(self) -> tuple[Any, ...]:
        """The DTensor placements of its mesh and spec (one per mesh axis).

        Raises:
            PlacementError: it has no mesh or spec (a result of an op; mark it first). Also a
                ``ValueError``, with torch_xla's message.
        """
        return self._layout("Placements not available").placements

    def invalidate_spec_cache(self) -> None:
        """Forget the cached `_spec` (torch_xla's method; `wrap_as_sharded_tensor` calls it)."""
        self._cached_spec = None

    def _layout(self, missing: str) -> Any:
        cached = self.__dict__.get("_cached_spec")
        if cached is not None:
            return cached
        mesh, spec = self._mesh_and_spec(missing)
        self._cached_spec = dtensor_spec(self.global_tensor, mesh, spec)
        return self._cached_spec

    def _mesh_and_spec(self, missing: str) -> tuple[Mesh, PartitionSpec]:
        """The mesh and spec it was marked with or that were recorded for it."""
        from spmd.errors import PlacementError

        mesh_shape, spec = self.mesh_shape, self.partition_spec
        if mesh_shape is None or spec is None:
            raise PlacementError(
                f"{missing}: XLAShardedTensor requires mesh_shape and partition_spec to be set. Use "
                "mark_sharding() to properly initialize sharding information."
            )
        sharding = self.sharding
        if sharding is not None and sharding.mesh.mesh_shape == mesh_shape:
            mesh = sharding.mesh
        else:  # recorded by torch_xla's constructor: the devices in id order, as torch_xla builds it
            mesh = Mesh(range(math.prod(mesh_shape)), mesh_shape)
        return mesh, PartitionSpec.from_value(spec)

    def redistribute(
        self, device_mesh: Any = None, placements: Any = None, *, async_op: bool = False
    ) -> XLAShardedTensor:
        """This value laid out as ``placements`` over ``device_mesh`` (our `Mesh`, a torch_xla
        mesh or an ``xla`` DeviceMesh; ``None``: its own mesh, as DTensor's) from here on: a
        sharding constraint, as torch_xla's. With ``async_op`` the result is a new tensor and
        this one keeps its layout.

        Raises:
            PlacementError: no placements, not one placement per mesh axis (a ``ValueError``), a
                ``Shard`` beyond the tensor's dims (`PlacementDimError`, an ``IndexError``), or a
                ``Partial`` (`PartialPlacementError`, a ``NotImplementedError``).
        """
        from mesh import as_mesh
        from spmd.errors import PlacementError
        from spmd.sharding import spec_from_placements

        where = f"redistribute(tensor of shape {tuple(self.shape)})"
        async_op = require_bool(async_op, f"{where}: async_op", SpmdTypeError)  # 'no' would have cloned
        if placements is None:
            raise PlacementError(f"{where}: give the placements, one per mesh axis (e.g. [Shard(0), Replicate()]).")
        if device_mesh is None:
            mesh = self._mesh_and_spec(f"{where} without a device_mesh")[0]
        else:
            mesh = as_mesh(device_mesh, where)
        spec = spec_from_placements(placements, mesh, self.dim(), by_index=True)
        # A mesh over fewer devices than the runtime's reached torch_xla as a raw error.
        mesh.check_device_count(runtime.device_count(), runtime.MORE_DEVICES)
        target = self.global_tensor.clone() if async_op else self.global_tensor
        sharding = NamedSharding(mesh, spec)
        shardings.attach_sharding_constraint(target, sharding.hlo_sharding(self.dim(), tuple(self.shape)), mesh.memo)
        return XLAShardedTensor._view(target, sharding)

    def to_local(self, *, grad_placements: Any = None) -> torch.Tensor:
        """Refused: on GSPMD one process holds every device's block, so there is no per-process
        local tensor (DTensor's ``to_local``); torch_xla's has none either.

        Raises:
            SpmdTypeError: always; the message names what to use instead.
        """
        raise SpmdTypeError(
            f"to_local: an XLAShardedTensor (shape {tuple(self.shape)}) has no per-process local tensor on GSPMD: "
            "this process holds every device's block. Use full_tensor() (or global_tensor) for the value, "
            "local_shards for each device's block."
        )

    def full_tensor(self) -> torch.Tensor:
        """The whole value (DTensor's name): on GSPMD the tensor already is the global value."""
        return self.global_tensor

    @property
    def local_shards(self) -> list[Shard]:
        """Each addressable device's block, copied to the host, in device order.

        Runs the pending computation of this tensor if it has not run yet.
        """
        return local_shards(self.global_tensor)

    def load_local_shards_(self, shards: list[Shard]) -> None:
        """Replace each device's block by ``shards[i].data`` (padded, as `local_shards` gives it).

        Raises:
            ShardLoadError: the tensor is replicated, a device is missing or repeated, or a
                block has the wrong shape or dtype. It is also a ``RuntimeError``, as torch_xla raises.
        """
        load_local_shards(self.global_tensor, shards, self.hlo_sharding, also=self)
        self.invalidate_spec_cache()  # torch_xla's does: the data under the cached spec changed

    # Ours ---------------------------------------------------------------------------------------
    @property
    def sharding(self) -> NamedSharding | None:
        """The mesh and spec `mark_sharding` was given (``None`` for a result of an op)."""
        return self.__dict__.get("_spmd_sharding")

    @property
    def hlo_sharding(self) -> HloSharding | None:
        """The XLA sharding the runtime holds; replicated for data on the devices that holds
        none; ``None`` for a traced value that holds none: its layout is not assigned yet (the
        compiler decides it; pytorch/xla#7846, where torch_xla's text is ``''``)."""
        held = shardings.sharding_of(self.global_tensor)
        if held is not None:
            return held
        return None if runtime.is_pending(self.global_tensor) else HloSharding.replicated()

    @property
    def global_shape(self) -> tuple[int, ...]:
        """The logical (unsharded) shape."""
        return tuple(self.shape)

    @property
    def shard_bounds(self) -> list[ShardBounds]:
        """Which block each device holds, with padding; computed, no device access."""
        sharding = self.sharding
        if sharding is not None:
            return sharding.shard_bounds(self.global_shape)
        hlo = self.hlo_sharding
        if hlo is None:
            raise ShardLoadError(
                f"The tensor of shape {tuple(self.shape)} is a traced value whose layout is not assigned yet (the "
                "compiler decides it): it has no blocks to show until it is computed (torch_xla.sync()), or mark it."
            )
        return hlo.shard_bounds(self.global_shape, list(range(runtime.device_count())))

    @property
    def padding(self) -> tuple[int, ...]:
        """The most padding any device's block has along each dim (zeros when even)."""
        bounds = self.shard_bounds
        return tuple(max(b.padding[d] for b in bounds) for d in range(len(self.global_shape)))

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"XLAShardedTensor({self.global_tensor})"  # torch_xla's text; sharding_spec has the layout


ShardedTensor = XLAShardedTensor
"""Our name for the torch_xla backend's sharded tensor type."""

# torch's C implementation of "run func with __torch_function__ off": what a context manager
# would do, without its per-op Python cost (half of the subclass's overhead, measured).
_call_as_plain_tensors = disabled_torch_function_impl

# Methods whose results describe the tensor rather than being it.
_PLAIN_RESULT = frozenset(
    {
        torch.Tensor.__repr__,
        torch.Tensor.__format__,
        torch.Tensor.__reduce_ex__,
        torch.Tensor.as_subclass,
    }
)


def _rewrap(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if type(value) is torch.Tensor and value.device.type == "xla":
            return XLAShardedTensor._view(value, None)
        return value
    if isinstance(value, (tuple, list)):
        return type(value)([_rewrap(v) for v in value])
    return value
