"""`XLAShardedTensor` (torch_xla's name; ours `ShardedTensor`): what `mark_sharding` returns on
torch_xla, a ``DTensor`` subclass (as torch_xla 2.9's) that is a view of the marked tensor and
knows its shards, its ``_spec``, placements and how to redistribute; with torch_xla's helpers
around it. It lives with the torch_xla backend, since every
method is a torch_xla call; on the DTensor backend `mark_sharding` returns a ``DTensor``.
"""

from mesh.naming import publish
from spmd._backend.torch_xla_backend.sharded_tensor import Shard, ShardedTensor, XLAShard, XLAShardedTensor
from spmd._backend.torch_xla_backend.wrapping import unwrap_sharded_tensor, wrap_as_sharded_tensor, wrap_if_sharded

__all__ = [
    "Shard",
    "ShardedTensor",
    "XLAShard",
    "XLAShardedTensor",
    "unwrap_sharded_tensor",
    "wrap_as_sharded_tensor",
    "wrap_if_sharded",
]

# Reprs, pickles and docs name the public path, as jax sets NamedSharding.__module__ = "jax.sharding";
# pickles that name the private module still load (the class lives on there);
# `mesh.naming.publish` resolves their annotations first, so typing.get_type_hints still works.
publish(__name__, Shard, XLAShardedTensor)
