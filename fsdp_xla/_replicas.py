"""Replicas of the shards kept in step by something outside the mesh: HSDP whose replicate dim is
not a mesh axis but a process group that changes while training runs.

torchft (`fsdp_xla.ft`) is the one such thing: each replica group is its own torchrun job, the
mesh FSDP gets is the group's own ranks (the shard axes), and the gradients are all-reduced across
the replica groups that are alive this step by torchft's managed process group. torchft 0.2.0 and
torchtitan build it so: ``fully_shard`` over the shard mesh, the replicate dim given to FSDP2 as
its all-reduce hook (``FSDPModule.set_all_reduce_hook``), not as a DeviceMesh dim, because a
DeviceMesh's groups are fixed when it is built and the live replica groups change every step.

This module is the core's side of that contract and imports no torchft: `FSDPOptions` accepts a
`ReplicaSync` as ``replicate_axis``, the DTensor backend's FSDP installs its hook on every unit, and the
torch_xla backend's FSDP refuses it (`fsdp_xla.errors.FaultToleranceError`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import torch

__all__ = ["ReplicaSync"]


class ReplicaSync(abc.ABC):
    """What keeps the replicas of the shards in step when they are not on one mesh axis.

    Given to FSDP as ``replicate_axis``; `fsdp_xla.ft.ReplicaGroup` is the implementation.
    """

    @abc.abstractmethod
    def all_reduce_hook(self) -> Callable[[torch.Tensor], None]:
        """A function FSDP2 calls with each unit's reduce-scattered gradient shard; it averages the
        shard in place over the replicas taking part in this step."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for error messages: what the replicas are and how many."""
