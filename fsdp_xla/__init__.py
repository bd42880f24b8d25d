"""FSDP on either backend: parameters stored sharded on an ``fsdp`` mesh axis, gathered per unit
for compute, with deferred init, mixed precision (`MixedPrecision`, with FSDP2's field names),
gradient checkpointing and sharded checkpoints. On the torch_xla backend each unit is traced into
GSPMD's graph (with optimization barriers); on the DTensor backend it is torch's ``fully_shard``
(FSDP2)."""

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
from mesh.naming import publish

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

# Reprs, pickles and docs name the public path, as jax sets NamedSharding.__module__ = "jax.sharding";
# pickles that name the private module still load (the class lives on there);
# `mesh.naming.publish` resolves their annotations first, so typing.get_type_hints still works.
publish(__name__, FSDPOptions, FullyShardedDataParallel)
