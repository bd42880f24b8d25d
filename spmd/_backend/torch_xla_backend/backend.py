"""`TorchXlaBackend`: the `ShardingBackend` protocol on torch_xla's GSPMD (a sharding is an
annotation on a lazy tensor; the compiler inserts the collectives)."""

from __future__ import annotations

from typing import Any

import torch

from spmd._backend.torch_xla_backend import processes
from spmd._backend.torch_xla_backend.dtensor_spec import xla_device_mesh
from spmd._backend.torch_xla_backend.runtime import (
    MORE_DEVICES,
    device_count,
    ensure_spmd,
    is_xla_tensor,
    optimization_barrier_,
    sync,
    torch_xla_module,
)
from spmd._backend.torch_xla_backend.sharded_tensor import XLAShardedTensor
from spmd._backend.torch_xla_backend.shardings import (
    attach_sharding,
    attach_sharding_constraint,
    clear_sharding,
    reshard_in_graph,
    sharding_of,
    to_device_sharded,
)
from spmd.sharding import HloSharding, ShardingKind

__all__ = ["TorchXlaBackend"]


class TorchXlaBackend:
    """`ShardingBackend` on torch_xla's GSPMD: a sharding is an annotation on a lazy tensor."""

    name = "torch_xla"
    more_devices = MORE_DEVICES

    def accepts(self, t: torch.Tensor) -> bool:
        return is_xla_tensor(t)

    def refusal(self, t: torch.Tensor, context: str) -> Exception:
        from spmd.errors import NotAnXlaTensorError

        return NotAnXlaTensorError(
            f"{context}: it is on device '{t.device}', not an XLA device. Move it first: "
            "t = t.to(torch_xla.device()) (modules: model.to(torch_xla.device())); or, in a torchrun job, "
            "shard it with the dtensor backend (torch.distributed.init_process_group() first)."
        )

    def device_count(self) -> int:
        return device_count()

    def shard(self, t: torch.Tensor, sharding: Any, hlo: HloSharding, *, replace: bool) -> torch.Tensor:
        from spmd.errors import ShardingConflictError

        ensure_spmd()
        existing = sharding_of(t)
        if existing is not None and existing != hlo:
            if existing.kind is ShardingKind.MANUAL:
                raise ShardingConflictError(
                    f"mark_sharding: the tensor of shape {tuple(t.shape)} is manually sharded ({{manual}}: inside an "
                    f"enable_manual_sharding region), so GSPMD cannot lay it out as {sharding.spec!r}. Call "
                    "disable_manual_sharding(t, spec, full_shape) first, then mark the result."
                )
            if existing.kind is not ShardingKind.REPLICATED and not replace:
                raise ShardingConflictError(
                    f"mark_sharding: the tensor of shape {tuple(t.shape)} is already sharded as {existing}; spec "
                    f"{sharding.spec!r} over {sharding.mesh.describe()} asks for {hlo}. Pass replace=True to reshard "
                    "it, or call clear_sharding(t) first."
                )
            reshard_in_graph(t)
            clear_sharding(t)
            existing = None
        if existing is None:
            attach_sharding(t, hlo, sharding.mesh.memo)
        return XLAShardedTensor._view(t, sharding)

    def constrain(self, t: torch.Tensor, sharding: Any, hlo: HloSharding) -> torch.Tensor:
        ensure_spmd()
        out = t.clone()
        attach_sharding_constraint(out, hlo, sharding.mesh.memo)
        return out

    def constrain_with_gradient(self, t: torch.Tensor, sharding: Any, hlo: HloSharding) -> torch.Tensor:
        from spmd._backend.torch_xla_backend.gradients import MarkShardingFunction

        ensure_spmd()
        return MarkShardingFunction.apply(t, sharding.mesh, sharding.spec)

    def clear(self, t: torch.Tensor) -> torch.Tensor:
        if not is_xla_tensor(t):
            raise self.refusal(t, f"clear_sharding(tensor of shape {tuple(t.shape)})")
        clear_sharding(t)
        return t

    def place(self, t: torch.Tensor, hlo: HloSharding) -> torch.Tensor:
        if is_xla_tensor(t):
            return t
        ensure_spmd()
        return to_device_sharded(t.detach().to("cpu").contiguous(), hlo).requires_grad_(t.requires_grad)

    def compute_device(self) -> torch.device:
        return torch_xla_module().device()

    def device_mesh(self, mesh: Any) -> Any:
        return xla_device_mesh(mesh)

    def parameter(self, p: torch.nn.Parameter, sharding: Any, hlo: HloSharding, *, specified: bool) -> Any:
        if specified:
            self.shard(p, sharding, hlo, replace=False)
        return p

    def buffer(self, b: torch.Tensor, mesh: Any) -> torch.Tensor:
        return b

    def step(self) -> None:
        sync()

    def barrier(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        optimization_barrier_(tensors)
        return tensors

    def sharding_of(self, t: torch.Tensor) -> HloSharding | None:
        return sharding_of(t) if is_xla_tensor(t) else None

    def process_index(self) -> int:
        return processes.process_index()

    def process_count(self) -> int:
        return processes.process_count()

    def device_processes(self) -> tuple[int, ...]:
        return processes.device_processes()

    def all_process_values(self, values: tuple[int, ...], *, same_length: bool = False) -> list[tuple[int, ...]]:
        return processes.all_process_values(values, same_length=same_length)

    def from_local_blocks(
        self, blocks: dict[int, torch.Tensor], sharding: Any, hlo: HloSharding, global_shape: tuple[int, ...]
    ) -> torch.Tensor:
        return processes.from_local_blocks(blocks, hlo, global_shape)
