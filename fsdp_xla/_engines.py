"""FSDP engines: how `fully_shard` shards a module on each runtime, behind one protocol.

On torch_xla's GSPMD (`fsdp_xla._gspmd`) parameters are annotated and the compiler inserts the
collectives our unit runtime asks for; on DTensor (`fsdp_xla._dtensor_fsdp`) each unit is
torch's ``fully_shard`` (FSDP2), which issues eager collectives. `engine_for` picks the engine of
the runtime `spmd.backend_for` chose for the module's parameters, so `fully_shard` itself never
asks which runtime it is on.
"""

from __future__ import annotations

from typing import Protocol

import torch

from fsdp_xla._dtensor_fsdp import DTensorEngine
from fsdp_xla._gspmd import GspmdEngine
from fsdp_xla._options import FSDPOptions
from spmd.backend import DTensorBackend, ShardingBackend, TorchXlaBackend

__all__ = ["FSDPEngine", "engine_for"]


class FSDPEngine(Protocol):
    """FSDP on one runtime."""

    def check(self, module: torch.nn.Module, options: FSDPOptions) -> None:
        """Refuse, before anything is sharded, what this runtime's FSDP cannot do."""
        ...

    def apply(self, module: torch.nn.Module, options: FSDPOptions) -> torch.nn.Module:
        """Shard ``module`` in place; return it."""
        ...


_ENGINES: dict[type, FSDPEngine] = {TorchXlaBackend: GspmdEngine(), DTensorBackend: DTensorEngine()}


def engine_for(runtime: ShardingBackend) -> FSDPEngine:
    """The FSDP engine of ``runtime``."""
    return _ENGINES[type(runtime)]
