"""Exceptions of fsdp_xla; each a ValueError or TypeError subclass whose message says what to change."""

from __future__ import annotations

__all__ = [
    "FSDPError",
    "FSDPTypeError",
    "WrapPolicyError",
    "MeshAxisError",
    "DeferredInitError",
    "CheckpointError",
    "CheckpointTypeError",
    "FaultToleranceError",
    "TorchftNotInstalledError",
]


class FSDPError(ValueError):
    """A module, mesh or option that FSDP cannot work with."""


class FSDPTypeError(TypeError):
    """An FSDP argument of the wrong type (the message names the types it takes)."""


class WrapPolicyError(FSDPError):
    """An auto-wrap policy that is ambiguous or names classes the model does not contain."""


class MeshAxisError(FSDPError):
    """The mesh has no axis to shard parameters on (``fsdp`` by default)."""


class DeferredInitError(FSDPError):
    """A module on the meta device that FSDP does not know how to initialize."""


class CheckpointError(FSDPError):
    """A checkpoint that is missing, corrupt, or does not match the model."""


class CheckpointTypeError(FSDPTypeError):
    """A checkpoint function's argument of the wrong type (a state_dict for the model, a tensor in
    ``extra``, ...)."""


class FaultToleranceError(FSDPError):
    """Healing HSDP (`fsdp_xla.ft`, torchft) asked of a runtime or process group it cannot run on:
    the torch_xla lane, or a backend torchft has no reconfigurable process group for."""


class TorchftNotInstalledError(ModuleNotFoundError):
    """`fsdp_xla.ft` was used where torchft is not installed. The message names the extra to
    install (``xla-spmd[ft]``); a ``ModuleNotFoundError``, which a bare ``import torchft`` raises."""
