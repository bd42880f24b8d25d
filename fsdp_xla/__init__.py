"""FSDP on GSPMD for PyTorch/XLA: parameters stored sharded on an ``fsdp`` mesh axis,
gathered per unit for compute, with optimization barriers, deferred init, mixed precision,
gradient checkpointing and sharded checkpoints."""

from fsdp_xla._options import FSDPOptions
from fsdp_xla.api import FSDP, FullyShardedDataParallel, OutputSharding, fully_shard
from fsdp_xla.deferred import deferred_init

# Exceptions live in fsdp_xla.errors (not star-exported); they resolve here too.
from fsdp_xla.errors import (  # noqa: F401
    CheckpointError,
    CheckpointTypeError,
    DeferredInitError,
    FaultToleranceError,
    FSDPError,
    FSDPTypeError,
    MeshAxisError,
    TorchftNotInstalledError,
    WrapPolicyError,
)
from fsdp_xla.policies import (
    MixedPrecision,
    SizeWrapPolicy,
    TransformerWrapPolicy,
    WrapPolicy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

__all__ = [
    "FSDP",
    "FSDPOptions",
    "FullyShardedDataParallel",
    "MixedPrecision",
    "OutputSharding",
    "SizeWrapPolicy",
    "TransformerWrapPolicy",
    "WrapPolicy",
    "deferred_init",
    "fully_shard",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]
