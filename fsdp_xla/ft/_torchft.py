"""The one place `fsdp_xla.ft` imports torchft: an optional extra, so ``import fsdp_xla`` and
``import fsdp_xla.ft`` work without it, and the first use says what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from fsdp_xla.errors import TorchftNotInstalledError

__all__ = ["torchft_module"]

INSTALL = "pip install 'xla-spmd[ft]' (torchft 0.2.0: CPython 3.10 to 3.13 on Linux)"


def torchft_module(name: str = "torchft", *, feature: str = "healing HSDP") -> ModuleType:
    """``import name`` (torchft or one of its modules).

    Raises:
        TorchftNotInstalledError: torchft is not installed; the message names the extra.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != "torchft":
            raise  # torchft is there and something it imports is not: its own error says what
        raise TorchftNotInstalledError(
            f"fsdp_xla.ft ({feature}) needs torchft, which is not installed here: {INSTALL}. Without it, train "
            "with FSDP's own replicate axis and resume from fsdp_xla.checkpoint.save_sharded's checkpoints."
        ) from None
