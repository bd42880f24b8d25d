"""`XLAShardedTensor`: what `mark_sharding` returns on torch_xla, a tensor that knows its shards.

It is a ``torch.Tensor`` subclass *view* of the marked tensor (``t.as_subclass``): the same
device data and sharding, attached to autograd, usable anywhere a tensor is. It is not a
wrapper holding another tensor (torch_xla's ``XLAShardedTensor`` is one, and drops
``requires_grad``), so in-place updates, ``torch_xla._XLAC`` queries and HLO text are those of
the marked tensor itself. Ops on it return `XLAShardedTensor` results while they stay on the
XLA device, as torch_xla's do; moving one off the device (``.cpu()``) gives a plain tensor.

On the DTensor backend `mark_sharding` returns a ``torch.distributed.tensor.DTensor``
instead: the value to keep is always the return value (``x = mark_sharding(x, ...)``), and
`spmd.get_sharding` reads the sharding of either.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mesh import Mesh
from spmd._backend.torch_xla_backend import runtime, shardings
from spmd._backend.torch_xla_backend.shard import Shard
from spmd.errors import ShardLoadError, SpmdTypeError
from spmd.sharding._hlo_sharding import HloSharding, ShardBounds, ShardingKind
from spmd.sharding._named_sharding import NamedSharding
from spmd.sharding._partition_spec import PartitionSpec
from spmd.sharding._sharding_type import ShardingType

__all__ = [
    "Shard",
    "XLAShard",
    "ShardedTensor",
    "XLAShardedTensor",
    "wrap_if_sharded",
    "wrap_as_sharded_tensor",
    "unwrap_sharded_tensor",
]


XLAShard = Shard
"""torch_xla's name for `Shard`."""


class XLAShardedTensor(torch.Tensor):
    """A sharded lazy XLA tensor: the marked tensor itself, seen with its sharding.

    Attributes of torch_xla's ``XLAShardedTensor`` (a DTensor there): `global_tensor`,
    `local_shards`, `load_local_shards_`, `sharding_spec`, `sharding_type`, `mesh_shape`,
    `partition_spec`, `placements`, `redistribute`; DTensor's `full_tensor`. Ours: `sharding`
    (mesh and spec), `hlo_sharding`, `global_shape`, `shard_bounds`, `padding`. Build one with
    `mark_sharding` (or, as torch_xla allows, ``XLAShardedTensor(t, mesh_shape, partition_spec)``,
    which only records them); ``isinstance(x, XLAShardedTensor)`` holds for its result and for
    tensors computed from it on the device.
    """

    _spmd_marked: torch.Tensor | None
    _spmd_sharding: NamedSharding | None
    _spmd_declared: tuple[Any, Any] | None

    def __new__(
        cls, elem: torch.Tensor, mesh_shape: Any = None, partition_spec: Any = None, *args: Any, **kwargs: Any
    ) -> XLAShardedTensor:
        """torch_xla's constructor: ``elem`` seen as a sharded tensor with the ``mesh_shape`` and
        ``partition_spec`` it records (nothing is laid out; `mark_sharding` does that)."""
        if not isinstance(elem, torch.Tensor):
            raise SpmdTypeError(f"XLAShardedTensor wraps a torch.Tensor, got {type(elem).__name__}.")
        inner = elem.global_tensor if isinstance(elem, XLAShardedTensor) else elem
        view = cls._view(inner, elem.sharding if isinstance(elem, XLAShardedTensor) else None)
        if mesh_shape is not None or partition_spec is not None:
            view._spmd_declared = _declared(mesh_shape, partition_spec)
        return view

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # everything happens in __new__
        pass

    @classmethod
    def _view(cls, tensor: torch.Tensor, sharding: NamedSharding | None) -> XLAShardedTensor:
        """A view of ``tensor`` (kept as `global_tensor`) carrying ``sharding``."""
        if type(tensor) is torch.Tensor or isinstance(tensor, torch.nn.Parameter):
            view = torch.Tensor.as_subclass(tensor, cls)
        else:  # a subclass with a __torch_function__ of its own
            with torch._C.DisableTorchFunctionSubclass():
                view = tensor.as_subclass(cls)
        view._spmd_marked = tensor
        view._spmd_sharding = sharding
        return view

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: D105
        # Ops run on the view itself (an autograd- and functionalization-tracked alias of the
        # marked tensor), so C++ code handed the view (torch_xla's FSDPv2 marks outputs with
        # _XLAC calls) and the ops after it see one tensor. Results stay sharded tensors while
        # on the XLA device (torch_xla's behaviour); a host copy is a plain tensor.
        if torch.compiler.is_compiling() or torch._guards.TracingContext.try_get() is not None:
            # Under torch.compile the view is the tensor it views: Dynamo traces the plain op.
            # (Rewrapping here, Dynamo wrapped each rewrapped result again, without end; and it
            # cannot trace the C helper below, so the context manager it knows does the same.)
            with torch._C.DisableTorchFunctionSubclass():
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
        with torch._C.DisableTorchFunctionSubclass():
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
    def placements(self) -> tuple[Any, ...]:
        """The DTensor placements of its mesh and spec (one per mesh axis).

        Raises:
            PlacementError: it has no mesh or spec (a result of an op; mark it first). Also a
                ``ValueError``, as torch_xla raises.
        """
        from spmd.sharding._placements import PlacementError, placements_from_spec

        mesh_shape, spec = self.mesh_shape, self.partition_spec
        if mesh_shape is None or spec is None:
            raise PlacementError(
                "Placements not available: XLAShardedTensor requires mesh_shape and partition_spec to be set. Use "
                "mark_sharding() to properly initialize sharding information."
            )
        sharding = self.sharding
        mesh = sharding.mesh if sharding is not None else Mesh(range(math.prod(mesh_shape)), mesh_shape)
        return placements_from_spec(PartitionSpec.from_value(spec), mesh, self.dim())

    def redistribute(self, device_mesh: Any, placements: Any, *, async_op: bool = False) -> XLAShardedTensor:
        """This value laid out as ``placements`` over ``device_mesh`` (our `Mesh`, a torch_xla
        mesh or an ``xla`` DeviceMesh) from here on: a sharding constraint, as torch_xla's.
        With ``async_op`` the result is a new tensor and this one keeps its layout.

        Raises:
            PlacementError: not one placement per mesh axis (a ``ValueError``), a ``Shard``
                beyond the tensor's dims (`PlacementDimError`, an ``IndexError``), or a
                ``Partial`` (`PartialPlacementError`, a ``NotImplementedError``).
        """
        from mesh import as_mesh
        from spmd.sharding._placements import spec_from_placements

        mesh = as_mesh(device_mesh, f"redistribute(tensor of shape {tuple(self.shape)})")
        spec = spec_from_placements(placements, mesh, self.dim(), by_index=True)
        target = self.global_tensor.clone() if async_op else self.global_tensor
        sharding = NamedSharding(mesh, spec)
        shardings.attach_sharding_constraint(target, sharding.hlo_sharding(self.dim(), tuple(self.shape)), mesh.memo)
        return XLAShardedTensor._view(target, sharding)

    def full_tensor(self) -> torch.Tensor:
        """The whole value (DTensor's name): on GSPMD the tensor already is the global value."""
        return self.global_tensor

    @property
    def local_shards(self) -> list[Shard]:
        """Each addressable device's block, copied to the host, in device order.

        Runs the pending computation of this tensor if it has not run yet.
        """
        tensor = self.global_tensor
        runtime.sync_tensors([tensor])
        hlo = self.hlo_sharding or HloSharding.replicated()  # computed now: it holds its layout
        if hlo.kind is ShardingKind.MANUAL:
            raise ShardLoadError(
                f"The tensor of shape {tuple(tensor.shape)} is manually sharded ({{manual}}); it has no global "
                "layout to cut into shards. Call disable_manual_sharding(...) first."
            )
        shards = shardings.local_shard_devices(tensor)
        replicated = hlo.kind is not ShardingKind.TILED
        bounds = {
            b.device: b for b in hlo.shard_bounds(tuple(tensor.shape), [shardings.device_id(d) for _, d in shards])
        }
        out = []
        for data, device in shards:
            b = bounds[shardings.device_id(device)]
            indices = Ellipsis if replicated else [slice(s.start, s.stop, 1) for s in b.index]
            out.append(Shard(data, indices, device, b.replica_id))
        return out

    def load_local_shards_(self, shards: list[Shard]) -> None:
        """Replace each device's block by ``shards[i].data`` (padded, as `local_shards` gives it).

        Raises:
            ShardLoadError: the tensor is replicated, a device is missing or repeated, or a
                block has the wrong shape or dtype. It is also a ``RuntimeError``, as torch_xla raises.
        """
        tensor = self.global_tensor
        hlo = self.hlo_sharding or HloSharding.replicated()
        where = f"load_local_shards_ (tensor of shape {tuple(tensor.shape)}, sharding {hlo})"
        if hlo.kind is not ShardingKind.TILED:
            raise ShardLoadError(
                f"{where}: a replicated tensor has no per-device blocks to load. Assign a new tensor, "
                "or mark it sharded first."
            )
        expected = {d: shape for d, shape in _padded_block_shapes(tensor, hlo)}
        given = [shardings.device_id(s.shard_device) for s in shards]
        if sorted(given) != sorted(expected):
            raise ShardLoadError(
                f"{where}: got blocks for devices {sorted(given)}, need exactly one for each of "
                f"{sorted(expected)}. Pass the whole list local_shards returned."
            )
        for s in shards:
            shape = tuple(s.data.shape)
            if s.data.dtype != tensor.dtype:  # the load would cast silently
                raise ShardLoadError(
                    f"{where}: the block for {s.shard_device} is {s.data.dtype}, the tensor {tensor.dtype}. Convert "
                    f"the blocks first (shard.data = shard.data.to({tensor.dtype}))."
                )
            if shape != expected[shardings.device_id(s.shard_device)]:
                raise ShardLoadError(
                    f"{where}: the block for {s.shard_device} has shape {shape}; the device holds "
                    f"{expected[shardings.device_id(s.shard_device)]} (padding included)."
                )
        datas, devices = [s.data for s in shards], [s.shard_device for s in shards]
        shardings.load_local_shards(tensor, datas, devices)
        if self is not tensor:
            # This view is a second tensor over the same data; the load swaps device data
            # under both, which functionalization cannot see, so each gets it.
            shardings.load_local_shards(self, datas, devices)

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
_call_as_plain_tensors = torch._C._disabled_torch_function_impl

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


def _declared(mesh_shape: Any, partition_spec: Any) -> tuple[Any, Any]:
    """torch_xla's constructor arguments, checked: a mesh shape of ints >= 1 and a spec."""
    from mesh._mesh import shape_arg

    shape = None if mesh_shape is None else shape_arg(mesh_shape, "XLAShardedTensor's mesh_shape")
    if partition_spec is not None:
        PartitionSpec.from_value(partition_spec)  # raises PartitionSpecTypeError for what is not a spec
    return shape, partition_spec


def _padded_block_shapes(tensor: torch.Tensor, hlo: HloSharding) -> list[tuple[int, tuple[int, ...]]]:
    devices = list(range(runtime.device_count()))
    return [(b.device, b.padded_shape) for b in hlo.shard_bounds(tuple(tensor.shape), devices)]


def wrap_if_sharded(x: Any) -> Any:
    """``x`` as an `XLAShardedTensor` if it is an XLA tensor with a sharding, else ``x`` itself."""
    if isinstance(x, torch.Tensor) and not isinstance(x, XLAShardedTensor) and runtime.is_xla_tensor(x):
        if shardings.sharding_type(x) is not None:
            return XLAShardedTensor._view(x, None)
    return x


def wrap_as_sharded_tensor(t: torch.Tensor, mesh_shape: Any = None, partition_spec: Any = None) -> XLAShardedTensor:
    """``t`` as an `XLAShardedTensor` (torch_xla's helper; ``mesh_shape`` and ``partition_spec``
    are accepted for its signature and not needed: the runtime holds the sharding)."""
    if isinstance(t, XLAShardedTensor):
        return t
    if not isinstance(t, torch.Tensor):
        raise SpmdTypeError(f"wrap_as_sharded_tensor expects a torch.Tensor, got {type(t).__name__}.")
    return XLAShardedTensor._view(t, None)


def unwrap_sharded_tensor(t: torch.Tensor) -> torch.Tensor:
    """The marked tensor behind an `XLAShardedTensor`, or ``t`` itself."""
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t
