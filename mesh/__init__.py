"""Logical device meshes with named axes: `Mesh`, `HybridMesh` (ICI x DCN), the global mesh, and
mesh roles (`ParallelDims`, `Role`: which axis carries data, fsdp, context or tensor parallelism).

The ground floor: values only. Nothing here imports ``spmd`` or ``fsdp_xla`` or asks a runtime;
where a runtime fact is needed (the device count, device attributes), it is handed in.
"""

from mesh._context import (
    GlobalMeshFollower,
    as_mesh,
    follow_global_mesh,
    get_1d_mesh,
    get_global_mesh,
    mesh_or_global,
    set_global_mesh,
    use_mesh,
)
from mesh._hybrid import DeviceInfo, HybridMesh, hybrid_device_order
from mesh._mesh import AxisRef, Mesh

# Exceptions live in mesh.errors (not star-exported); they resolve here too.
from mesh.errors import DeviceCountError, MeshError, MeshTypeError, NoMeshError  # noqa: F401
from mesh.naming import publish
from mesh.roles import ParallelDims, Role

__all__ = [
    "AxisRef",
    "DeviceInfo",
    "GlobalMeshFollower",
    "HybridMesh",
    "Mesh",
    "ParallelDims",
    "Role",
    "as_mesh",
    "follow_global_mesh",
    "get_1d_mesh",
    "get_global_mesh",
    "hybrid_device_order",
    "mesh_or_global",
    "set_global_mesh",
    "use_mesh",
]

# Reprs, pickles and docs name the public path, as jax sets NamedSharding.__module__ = "jax.sharding";
# pickles that name the private module still load (the class lives on there);
# `mesh.naming.publish` resolves their annotations first, so typing.get_type_hints still works.
publish(__name__, DeviceInfo, GlobalMeshFollower, HybridMesh, Mesh)
