"""torch_xla's SPMD surface under our names, apart from the product's own concepts.

``import spmd as xs`` stands in for ``import torch_xla.distributed.spmd as xs``. The modules here
carry torch_xla's submodule names (``spmd.xla_sharding``, ``spmd.api``, ``spmd.debugging``,
``spmd.sharding_spec``, ``spmd.xla_sharded_tensor`` still import: ``spmd`` registers them under
those paths), torch_xla's mesh methods and runtime defaults (`xla_mesh`), and its DTensor-style
helpers (`api`). Each is a thin layer over the product's own API (docs/migration.md).
"""

from spmd.compat import api, debugging, sharding_spec, xla_mesh, xla_sharded_tensor, xla_sharding

__all__ = ["api", "debugging", "sharding_spec", "xla_mesh", "xla_sharded_tensor", "xla_sharding"]

# torch_xla's submodule paths, as they were before this package: ``import spmd.xla_sharding``.
OLD_PATHS = ("api", "debugging", "sharding_spec", "xla_sharded_tensor", "xla_sharding")
