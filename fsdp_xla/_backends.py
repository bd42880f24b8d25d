"""FSDP per backend: how `fully_shard` shards a module on each backend, behind one protocol.

On the torch_xla backend (GSPMD, `fsdp_xla._gspmd`) parameters are annotated and the compiler
inserts the collectives each unit asks for at run time (`fsdp_xla._gspmd_unit`); on the DTensor
backend (`fsdp_xla._dtensor_fsdp`) each unit is torch's ``fully_shard`` (FSDP2), which issues
eager collectives. `fsdp_backend_for` picks the FSDP of the backend `spmd.backend_for` chose for
the module's parameters, so `fully_shard` itself never asks which backend it is on.
"""

from __future__ import annotations

from typing import Protocol

import torch

from fsdp_xla._dtensor_fsdp import DTensorFSDP
from fsdp_xla._gspmd import GspmdFSDP
from fsdp_xla._options import FSDPOptions
from spmd.backend import DTensorBackend, ShardingBackend, TorchXlaBackend

__all__ = ["FSDPBackend", "fsdp_backend_for"]


class FSDPBackend(Protocol):
    """FSDP on one backend."""

    def check(self, module: torch.nn.Module, options: FSDPOptions) -> None:
        """Refuse, before anything is sharded, what this backend's FSDP cannot do."""
        ...

    def apply(self, module: torch.nn.Module, options: FSDPOptions) -> torch.nn.Module:
        """Shard ``module`` in place; return it."""
        ...


_FSDP_BY_BACKEND: dict[type, FSDPBackend] = {TorchXlaBackend: GspmdFSDP(), DTensorBackend: DTensorFSDP()}


def fsdp_backend_for(backend: ShardingBackend) -> FSDPBackend:
    """The FSDP of ``backend``."""
    return _FSDP_BY_BACKEND[type(backend)]
