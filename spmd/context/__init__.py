"""Context parallelism: the sequence of every attention split over a mesh axis (`context_parallel`).

`context_parallel` makes a model's ``scaled_dot_product_attention`` calls compute over a sequence
split across the ``context`` axis (MaxText's ``all_gather`` strategy, on both backends);
`ContextParallel.shard_batch` splits a batch's sequences to match, in the load-balanced order of
`SequenceOrder`. `mesh.ParallelDims` names the axes (``ParallelDims(fsdp=2, context=2).mesh()``).
"""

from mesh.naming import publish
from spmd.context._order import SequenceOrder
from spmd.context._parallel import STRATEGIES, ContextParallel, context_parallel

__all__ = ["STRATEGIES", "ContextParallel", "SequenceOrder", "context_parallel"]

# Reprs, pickles and docs name the public path, as jax sets NamedSharding.__module__ = "jax.sharding";
# pickles that name the private module still load (the class lives on there);
# `mesh.naming.publish` resolves their annotations first, so typing.get_type_hints still works.
publish(__name__, ContextParallel, SequenceOrder)
