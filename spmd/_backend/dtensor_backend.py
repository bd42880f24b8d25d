"""The DTensor backend: `ShardingBackend` on ``torch.distributed``'s DTensor, one process per device.

A `Mesh` becomes a ``DeviceMesh`` over the same ranks, in the same order and with the same axis
names (device id = rank). Any order of ids works where torch can order a process group's members
(`torch_compat.ordered_groups_supported`, torch 2.15): each axis's groups then list their ranks in
mesh-coordinate order, so every rank holds the block torch_xla gives that device id and every
collective assembles blocks in mesh order, as on the permuted meshes TorchTPU's
``topology_aware_mesh`` returns. On torch 2.9 a mesh whose ids do not increase along every axis
is refused (DTensor would put blocks in rank order there).

A `PartitionSpec` becomes placements: a dim sharded by one mesh axis is ``Shard(dim)`` on that
axis, by several axes in mesh order ``Shard(dim)`` on each (the first is the major one, as in
GSPMD), by two axes against mesh order ``_StridedShard`` on the first; mesh axes the spec does not
name are ``Replicate()``; axes of size 1 split nothing and are left out. `shard` distributes a
plain tensor (every rank holds the same global value, rank 0's is sent) or redistributes a
DTensor, and returns the DTensor; that is the value to keep. This runs on TorchTPU (``tpu``
device), GPUs, and CPU processes with the gloo backend.

Uneven splits follow GSPMD's padding rule on one axis (blocks of ``ceil(n / k)``, the last ones
short or empty), which is DTensor's too. A layout DTensor cannot hold raises `ShardingError`
instead of laying data out differently: a dim split over several mesh axes whose blocks would
differ from GSPMD's (DTensor splits it axis by axis, rounding up each time; GSPMD once over all
of them), a dim split against mesh order that does not divide evenly, or more than two axes
against mesh order.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import torch

from spmd._backend import dtensor_processes
from spmd._backend.agreement import agree_on_sharding
from spmd._backend.dtensor_meshes import device_mesh
from spmd._util import torch_compat
from spmd.errors import ShardingConflictError, ShardingError
from spmd.sharding import (
    HloSharding,
    NamedSharding,
    PartitionSpec,
    ShardingKind,
    hlo_sharding_for,
    placements_from_spec,
    resolve_spec,
    spec_from_placements,
)

__all__ = ["DTensorBackend", "device_mesh", "placements_for", "process_device_type", "spec_of"]


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def device_type_of(t: torch.Tensor) -> str:
    """The DeviceMesh device type for tensors like ``t`` (``cpu`` with gloo, ``cuda``, ``tpu``);
    a ``meta`` tensor (deferred init) takes this process's device type."""
    return process_device_type() if t.is_meta else t.device.type


def process_device_type() -> str:
    """The device type this process computes on: its accelerator (``cuda``, TorchTPU's ``tpu``)
    when there is one, else ``cpu``."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return accelerator.type if accelerator is not None else "cpu"


def _gspmd_blocks(n: int, ways: int) -> list[tuple[int, int]]:
    size = -(-n // ways)
    return [(min(i * size, n), min((i + 1) * size, n)) for i in range(ways)]


def _dtensor_blocks(n: int, axis_sizes: list[int]) -> list[tuple[int, int]]:
    """The blocks DTensor gives a dim of ``n`` split by ``Shard`` on axes of these sizes, in mesh
    order: each axis chunks what the previous one left (``torch.chunk``'s rounding up)."""
    blocks = [(0, n)]
    for k in axis_sizes:
        blocks = [b for start, stop in blocks for b in _gspmd_blocks_in(start, stop, k)]
    return blocks


def _gspmd_blocks_in(start: int, stop: int, ways: int) -> list[tuple[int, int]]:
    return [(start + a, start + b) for a, b in _gspmd_blocks(stop - start, ways)]


def placements_for(mesh: Any, spec: PartitionSpec, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """DTensor placements (one per mesh axis) that lay a tensor of ``shape`` out as ``spec``
    exactly as GSPMD does (`spmd.sharding.placements_from_spec`, checked against the shape).

    Raises:
        ShardingError: DTensor cannot hold the layout GSPMD gives (see the module docstring).
    """
    dims = resolve_spec(mesh, spec, len(shape), shape)
    placements = placements_from_spec(spec, mesh, len(shape))
    for dim, named in enumerate(dims):
        axes = [a for a in named if mesh.mesh_shape[a] > 1]
        if len(axes) < 2:
            continue
        where = f"tensor of shape {tuple(shape)}, spec {spec!r}, {mesh.describe()}"
        sizes = [mesh.mesh_shape[a] for a in axes]
        if axes != sorted(axes):
            if shape[dim] % math.prod(sizes):
                raise ShardingError(
                    f"{where}: dim {dim} ({shape[dim]}) is split over mesh axes "
                    f"{[mesh.axis_label(a) for a in axes]} against mesh order, which DTensor holds as a strided "
                    f"shard only when the dim divides evenly ({math.prod(sizes)} ways). Pad dim {dim}, or list "
                    "the axes in mesh order."
                )
        elif _dtensor_blocks(shape[dim], sizes) != _gspmd_blocks(shape[dim], math.prod(sizes)):
            raise ShardingError(
                f"{where}: dim {dim} ({shape[dim]}) is split over {len(axes)} mesh axes ({math.prod(sizes)} "
                "ways), and DTensor would cut it differently from GSPMD (it splits axis by axis, rounding up "
                f"each time; GSPMD once). Pad dim {dim} to a multiple of {math.prod(sizes)}, or split it over "
                "one mesh axis."
            )
    _check_empty_blocks(placements, dims, mesh, spec, shape)
    return placements


def _check_empty_blocks(placements: list[Any], dims: tuple, mesh: Any, spec: PartitionSpec, shape: tuple) -> None:
    """Refuse, where this torch's DTensor cannot lay it out, a layout that splits the tensor on
    several mesh axes and gives some device an empty block (see `torch_compat.splits_empty_blocks`)."""
    if torch_compat.splits_empty_blocks() or sum(torch_compat.is_shard(p) for p in placements) < 2:
        return
    for dim, axes in enumerate(dims):
        ways = math.prod(mesh.mesh_shape[a] for a in axes)
        if any(start == stop for start, stop in _gspmd_blocks(shape[dim], ways)):
            major, minor = torch_compat.TORCH_VERSION
            raise ShardingError(
                f"tensor of shape {tuple(shape)}, spec {spec!r}, {mesh.describe()}: dim {dim} ({shape[dim]}) split "
                f"{ways} ways leaves some device an empty block, and the tensor is split on several mesh axes: torch "
                f"{major}.{minor}'s distribute_tensor fails on that (F.pad of an empty block splits again). The "
                f"current lane's torch (2.15) lays it out. Split the tensor on one mesh axis, or pad dim {dim}."
            )


def spec_of(mesh: Any, placements: tuple[Any, ...], rank: int) -> PartitionSpec:
    """The `PartitionSpec` of a DTensor's ``placements`` on ``mesh`` (`spmd.sharding`).

    Raises:
        ShardingError: a ``Partial`` placement (a pending sum has no layout of its own).
    """
    return spec_from_placements(placements, mesh, rank)


def _no_process_group() -> str:
    """Why the dtensor backend cannot run yet, and the ways on: torchrun, or (where torch_xla is
    not installed, as on the current lane) the torch_xla lane for one process."""
    text = (
        "the dtensor backend needs torch.distributed: launch with torchrun and call "
        "torch.distributed.init_process_group() (backend 'gloo' on CPU) before sharding."
    )
    if importlib.util.find_spec("torch_xla") is None:
        from spmd.errors import INSTALL_TORCH_XLA

        text += f" For GSPMD in one process, the torch_xla lane: {INSTALL_TORCH_XLA}."
    return text


class DTensorBackend:
    """`ShardingBackend` on DTensor: a sharding is a DTensor's placements over a DeviceMesh."""

    name = "dtensor"
    more_devices = "launch one process per device: torchrun --nproc_per_node n (on k hosts, --nnodes k, n per host)"

    def accepts(self, t: torch.Tensor) -> bool:
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):
            return True
        dist = _dist()
        return isinstance(t, torch.Tensor) and dist.is_available() and dist.is_initialized() and t.device.type != "xla"

    def refusal(self, t: torch.Tensor, context: str) -> Exception:
        from spmd.errors import SpmdTypeError

        dist = _dist()
        if not (dist.is_available() and dist.is_initialized()):
            return SpmdTypeError(f"{context}: {_no_process_group()}")
        return SpmdTypeError(
            f"{context}: it is on device '{t.device}', an XLA device, and the dtensor backend shards tensors of "
            "torch.distributed's devices (CPU, CUDA, TorchTPU's tpu). Shard XLA tensors with "
            "spmd.use_backend('torch_xla'), or create the tensor on this process's device."
        )

    def device_count(self) -> int:
        dist = _dist()
        if not (dist.is_available() and dist.is_initialized()):
            from spmd.errors import SpmdTypeError

            raise SpmdTypeError(_no_process_group())
        return dist.get_world_size()

    def shard(self, t: torch.Tensor, sharding: NamedSharding, hlo: HloSharding, *, replace: bool) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, distribute_tensor

        # The ranks agreed on the arguments before this (`spmd._backend.agreement`, at the entry
        # points): DTensor sends rank 0's data and each rank cuts blocks by its own shape and spec.
        placements = placements_for(sharding.mesh, sharding.spec, tuple(t.shape))
        if isinstance(t, DTensor):
            existing = self.sharding_of(t)
            if existing == hlo:
                return t
            if existing is not None and existing.kind is not ShardingKind.REPLICATED and not replace:
                raise ShardingConflictError(
                    f"mark_sharding: the DTensor of shape {tuple(t.shape)} is already sharded as {existing}; spec "
                    f"{sharding.spec!r} over {sharding.mesh.describe()} asks for {hlo}. Pass replace=True to "
                    "redistribute it."
                )
            return torch_compat.redistribute(t, device_mesh(sharding.mesh, t.device_mesh.device_type), placements)
        mesh = device_mesh(sharding.mesh, device_type_of(t))
        return distribute_tensor(t.detach() if not t.requires_grad else t, mesh, placements)

    def constrain(self, t: torch.Tensor, sharding: NamedSharding, hlo: HloSharding) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if not isinstance(t, DTensor):  # distributed from every rank's copy: the ranks agree first
            agree_on_sharding(self, "with_sharding_constraint", t, sharding.mesh, sharding.spec)
            return self.shard(t, sharding, hlo, replace=True)
        # Always a redistribute, even to the layout ``t`` has: its backward lays the gradient out
        # as ``t`` was, which is what keeps DTensor's propagation on a layout it can follow (a
        # row-parallel projection otherwise sends a head-sharded gradient into attention, whose
        # batched matmul DTensor cannot flatten; examples/train_spmd.py).
        placements = placements_for(sharding.mesh, sharding.spec, tuple(t.shape))
        return torch_compat.redistribute(t, device_mesh(sharding.mesh, t.device_mesh.device_type), placements)

    def constrain_with_gradient(self, t: torch.Tensor, sharding: NamedSharding, hlo: HloSharding) -> torch.Tensor:
        return self.constrain(t, sharding, hlo)  # a redistribute's backward lays the gradient out alike

    def clear(self, t: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Replicate

        if not isinstance(t, DTensor):
            return t  # a plain tensor has no layout to clear
        # A DTensor's layout is its type, not an annotation: the value comes back replicated.
        return t.redistribute(t.device_mesh, [Replicate()] * t.device_mesh.ndim)

    def place(self, t: torch.Tensor, hlo: HloSharding) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor) or t.device == self.compute_device():
            return t
        return t.to(self.compute_device())

    def compute_device(self) -> torch.device:
        kind = process_device_type()
        if kind == "cpu":
            return torch.device("cpu")
        return torch.device(kind, torch.accelerator.current_device_index())

    def device_mesh(self, mesh: Any) -> Any:
        return device_mesh(mesh, process_device_type())

    def parameter(
        self, p: torch.nn.Parameter, sharding: NamedSharding, hlo: HloSharding, *, specified: bool
    ) -> torch.nn.Parameter:
        from torch.distributed.tensor import DTensor

        if isinstance(p, DTensor) and not specified:  # laid out already: keep it
            return p
        return torch.nn.Parameter(self.shard(p, sharding, hlo, replace=False), requires_grad=p.requires_grad)

    def buffer(self, b: torch.Tensor, mesh: Any) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if isinstance(b, DTensor):
            return b
        replicated = NamedSharding(mesh, PartitionSpec())
        return self.shard(b, replicated, hlo_sharding_for(mesh, PartitionSpec(), b.dim()), replace=False)

    def step(self) -> None:
        """Eager: every op already ran."""

    def barrier(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """TorchTPU's ``torch.tpu.ops.optimization_barrier`` where it exists (a DTensor's local
        block goes through it); elsewhere (CPU, CUDA eager) nothing merges work across steps, so
        the tensors come back as they are."""
        from torch.distributed.tensor import DTensor

        tpu_barrier = torch_compat.tpu_optimization_barrier()
        if tpu_barrier is None or not tensors:
            return list(tensors)
        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        passed = tpu_barrier(local)
        return [
            DTensor.from_local(p, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
            if isinstance(t, DTensor)
            else p
            for t, p in zip(tensors, passed)
        ]

    def sharding_of(self, t: torch.Tensor) -> HloSharding | None:
        from torch.distributed.tensor import DTensor

        if not isinstance(t, DTensor):
            return None
        mesh = mesh_of(t.device_mesh)
        spec = spec_of(mesh, tuple(t.placements), t.dim())
        return hlo_sharding_for(mesh, spec, t.dim(), tuple(t.shape))

    def process_index(self) -> int:
        return dtensor_processes.process_index()

    def process_count(self) -> int:
        return dtensor_processes.process_count()

    def device_processes(self) -> tuple[int, ...]:
        return dtensor_processes.device_processes()

    def all_process_values(self, values: tuple[int, ...], *, same_length: bool = False) -> list[tuple[int, ...]]:
        return dtensor_processes.all_process_values(values, same_length=same_length)

    def from_local_blocks(
        self, blocks: dict[int, torch.Tensor], sharding: NamedSharding, hlo: HloSharding, global_shape: tuple[int, ...]
    ) -> torch.Tensor:
        kind = process_device_type()
        placements = placements_for(sharding.mesh, sharding.spec, global_shape)
        return dtensor_processes.from_local_block(blocks, device_mesh(sharding.mesh, kind), placements, global_shape)


def mesh_of(device_mesh: Any) -> Any:
    """Our `Mesh` for a ``DeviceMesh`` (the same ranks, order and axis names)."""
    from mesh import Mesh

    return Mesh.from_device_mesh(device_mesh)
