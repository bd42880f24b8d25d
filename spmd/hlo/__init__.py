"""Reading XLA's HLO text (pure Python, no runtime): modules, instructions, array shapes and
replica groups, as ``--xla_dump_hlo_as_text`` and a compiled executable's ``as_text()`` write
them.

The seam between what compiles a program and what reads it: the inspector reads torch_xla's
dumps with it, the planner the TPU compiler's output, `fsdp_xla.communication` its collectives.

- `HloModuleText`: one module's computations and instructions, and what follows values back
  through layout changes to an entry parameter.
- `Instruction`: one instruction (name, shape, opcode, operands, attributes, metadata).
- `ArrayShape`, `parse_shape`, `DTYPE_BYTES`: shapes and their bytes.
- `parse_replica_groups`, `mesh_axes_groups`: a collective's groups of devices.
- `module_scope`, `annotation_scopes`: the scopes torch_xla writes into each op's ``op_name``.
"""

from mesh.naming import publish
from spmd.hlo._groups import mesh_axes_groups as mesh_axes_groups
from spmd.hlo._groups import parse_replica_groups as parse_replica_groups
from spmd.hlo._shape import DTYPE_BYTES as DTYPE_BYTES
from spmd.hlo._shape import ArrayShape as ArrayShape
from spmd.hlo._shape import parse_shape as parse_shape
from spmd.hlo._text import HloModuleText as HloModuleText
from spmd.hlo._text import Instruction as Instruction
from spmd.hlo._text import annotation_scopes as annotation_scopes
from spmd.hlo._text import module_scope as module_scope

__all__ = [
    "DTYPE_BYTES",
    "ArrayShape",
    "HloModuleText",
    "Instruction",
    "annotation_scopes",
    "mesh_axes_groups",
    "module_scope",
    "parse_replica_groups",
    "parse_shape",
]

# Reprs, pickles and docs name the public path, as jax sets NamedSharding.__module__ = "jax.sharding";
# pickles that name the private module still load (the class lives on there);
# `mesh.naming.publish` resolves their annotations first, so typing.get_type_hints still works.
publish(__name__, ArrayShape, HloModuleText, Instruction)
