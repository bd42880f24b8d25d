"""`ShardingBackend`: what a runtime must do for `mark_sharding` and its relatives.

Two implement it: `torch_xla_backend` (GSPMD on lazy XLA tensors: a sharding is an annotation on
the tensor, the compiler inserts collectives) and `dtensor_backend` (``torch.distributed``'s
DTensor, one process per device: a sharding is a DTensor's placements, the data moves when it
is laid out). Operations are functional, value in and value out: `shard` and `constrain` return
the tensor to keep. Everything else in the product speaks `NamedSharding` and `HloSharding`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from mesh import Mesh
from spmd.sharding import HloSharding, NamedSharding

__all__ = ["ShardingBackend"]


class ShardingBackend(Protocol):
    """A runtime that lays tensors out over a mesh of devices."""

    name: str
    more_devices: str
    """How to run with more devices, for error messages (``spmd.configure_default_devices(n)``;
    ``torchrun --nproc_per_node n``)."""

    def accepts(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is a tensor this backend can shard (an XLA tensor; a DTensor or a
        tensor on this process's device)."""
        ...

    def refusal(self, t: torch.Tensor, context: str) -> Exception:
        """The error for a tensor ``accepts`` refuses: ``context`` (the call, shape, spec and
        mesh), why this backend cannot take it, and what to do."""
        ...

    def device_count(self) -> int:
        """The devices a mesh must cover (all hosts)."""
        ...

    def shard(self, t: torch.Tensor, sharding: NamedSharding, hlo: HloSharding, *, replace: bool) -> torch.Tensor:
        """``t`` laid out as ``sharding`` (``hlo`` is its XLA form); the tensor to keep.
        A different non-replicated sharding already on ``t`` is a conflict unless ``replace``."""
        ...

    def constrain(self, t: torch.Tensor, sharding: NamedSharding, hlo: HloSharding) -> torch.Tensor:
        """A tensor equal to ``t`` that must be laid out as ``sharding`` at this point; ``t``
        is left as it is."""
        ...

    def constrain_with_gradient(self, t: torch.Tensor, sharding: NamedSharding, hlo: HloSharding) -> torch.Tensor:
        """`constrain`, and the same constraint on the gradient in backward."""
        ...

    def clear(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` with no sharding of its own (torch_xla: the annotation removed, in place;
        DTensor: a replicated DTensor); the tensor to keep."""
        ...

    def place(self, t: torch.Tensor, hlo: HloSharding) -> torch.Tensor:
        """``t`` on this runtime's devices, laid out as ``hlo`` where the copy itself can do it
        (torch_xla sends each device its shard; DTensor keeps the host tensor, every process
        holding the whole value); `shard` then lays it out. ``t`` as it is when it is there."""
        ...

    def compute_device(self) -> torch.device:
        """The device this process computes on (``xla:0``; ``cpu`` with gloo, ``cuda:i``, ``tpu``)."""
        ...

    def device_mesh(self, mesh: Mesh) -> Any:
        """``mesh`` as a ``torch.distributed`` ``DeviceMesh`` of this runtime (device type
        ``xla`` on torch_xla; the process groups' device type on DTensor)."""
        ...

    def parameter(
        self, p: torch.nn.Parameter, sharding: NamedSharding, hlo: HloSharding, *, specified: bool
    ) -> torch.nn.Parameter:
        """``p`` laid out as ``sharding``; the parameter the module must hold from now on: ``p``
        itself, sharded in place, on torch_xla (left as it is there when no spec was
        ``specified``), a new ``nn.Parameter`` holding a DTensor on DTensor (replicated when no
        spec was ``specified``: DTensor ops refuse to mix plain tensors with DTensors)."""
        ...

    def buffer(self, b: torch.Tensor, mesh: Mesh) -> torch.Tensor:
        """The buffer a module sharded over ``mesh`` must hold: ``b`` itself on torch_xla, a
        replicated DTensor on DTensor (whose ops refuse to mix plain tensors with DTensors)."""
        ...

    def step(self) -> None:
        """End a training step: run what was traced (torch_xla's ``torch_xla.sync()``); nothing
        on an eager runtime, where each op ran when it was called."""
        ...

    def barrier(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` through one optimization barrier: the compiler may not move work across it
        nor merge a value computed before it with one computed after it. The tensors to use from
        here on (torch_xla: the same tensors, updated in place)."""
        ...

    def sharding_of(self, t: torch.Tensor) -> HloSharding | None:
        """The sharding ``t`` has, as XLA would write it, or ``None`` when it has none."""
        ...

    def process_index(self) -> int:
        """This process's index among the job's processes (0 when there is one)."""
        ...

    def process_count(self) -> int:
        """The number of processes of the job (torch_xla: one per host; DTensor: one per device)."""
        ...

    def device_processes(self) -> tuple[int, ...]:
        """The process that holds each device id (position = device id)."""
        ...

    def all_process_values(self, values: tuple[int, ...], *, same_length: bool = False) -> list[tuple[int, ...]]:
        """Every process's ``values`` (a few ints), in process order. A collective: every
        process calls it, in the same order. ``same_length``: the caller guarantees every
        process passes as many values, so one fixed-size exchange does (no exchange of lengths
        first; a length that differed would abort gloo)."""
        ...

    def from_local_blocks(
        self, blocks: dict[int, torch.Tensor], sharding: NamedSharding, hlo: HloSharding, global_shape: tuple[int, ...]
    ) -> torch.Tensor:
        """A tensor of ``global_shape`` laid out as ``sharding`` (``hlo``) whose device ``d``
        holds ``blocks[d]``: host tensors, unpadded, one for each device of this process."""
        ...
