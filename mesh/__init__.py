"""Logical device meshes with named axes: `Mesh`, `HybridMesh` (ICI x DCN), and the global mesh."""

from mesh._context import get_1d_mesh, get_global_mesh, mesh_or_global, set_global_mesh, use_mesh
from mesh._hybrid import DeviceInfo, HybridMesh, hybrid_device_order
from mesh._mesh import AxisRef, Mesh
from mesh.errors import DeviceCountError, MeshError, MeshTypeError, NoMeshError

__all__ = [
    "AxisRef",
    "DeviceCountError",
    "DeviceInfo",
    "HybridMesh",
    "Mesh",
    "MeshError",
    "MeshTypeError",
    "NoMeshError",
    "get_1d_mesh",
    "get_global_mesh",
    "hybrid_device_order",
    "mesh_or_global",
    "set_global_mesh",
    "use_mesh",
]
