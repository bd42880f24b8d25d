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
