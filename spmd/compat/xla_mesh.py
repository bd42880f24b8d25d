"""torch_xla's meshes where they meet the runtime: `Mesh` and `HybridMesh` with torch_xla's
runtime methods, `get_1d_mesh` over the backend's devices, and torch_xla's global mesh kept equal
to ours.

``mesh.Mesh`` is a value that asks no runtime. torch_xla's code asks a mesh for ``OpSharding``
objects (``get_op_sharding``), and torch_xla's ``HybridMesh`` and ``get_1d_mesh`` read the
runtime's devices; those live here, where the mesh meets torch_xla, on subclasses that are the
same values (``spmd.Mesh(...) == mesh.Mesh(...)``). ``import spmd`` registers
`TorchXlaGlobalMesh`, so ``set_global_mesh`` (either package's) also sets torch_xla's global
mesh, which torch_xla's FSDPv2 and the Hugging Face Trainer's ``xla_fsdp_v2`` path read.
"""

from __future__ import annotations

from collections.abc import Sequence

import mesh as _mesh
from mesh import DeviceInfo, as_mesh
from spmd._backend import backend_for, torch_xla_backend
from spmd.sharding import PartitionSpec, hlo_sharding_for

__all__ = ["HybridMesh", "Mesh", "TorchXlaGlobalMesh", "get_1d_mesh"]


class Mesh(_mesh.Mesh):
    """`mesh.Mesh` with torch_xla's runtime methods (``get_op_sharding``,
    ``_get_op_sharding_args``); the same value, equal and hashed alike."""

    __slots__ = ()

    @classmethod
    def of(cls, mesh: _mesh.Mesh) -> Mesh:
        """``mesh`` as this class (itself when it already is one)."""
        if isinstance(mesh, Mesh):
            return mesh
        return cls(mesh.device_ids, mesh.mesh_shape, mesh.axis_names)

    def get_op_sharding(self, partition_spec: Sequence[object]) -> object:
        """torch_xla's ``OpSharding`` for a tensor of rank ``len(partition_spec)`` sharded as
        ``partition_spec`` (what ``torch_xla._XLAC`` functions take), built once per mesh.

        Raises:
            ShardingError: the spec does not fit this mesh (the message says why).
        """
        return torch_xla_backend.op_sharding(self._hlo(partition_spec), self.memo)

    def _get_op_sharding_args(self, partition_spec: Sequence[object]) -> tuple[list, list, list, int]:
        """torch_xla's ``(tile_assignment, group_assignment, replication_groups, sharding_type)``
        for ``partition_spec``: the arguments of ``OpSharding`` giving the same sharding."""
        return torch_xla_backend.sharding_args(self._hlo(partition_spec))

    def _hlo(self, partition_spec: Sequence[object]) -> object:
        spec = PartitionSpec.from_value(partition_spec)
        return hlo_sharding_for(self, spec, len(spec))


class HybridMesh(_mesh.HybridMesh, Mesh):
    """torch_xla's ``HybridMesh``: `mesh.HybridMesh` over the backend's devices when ``devices``
    is not given (their ``coords``, ``core_on_chip`` and ``slice_index``)."""

    __slots__ = ()

    def __init__(
        self,
        *,
        ici_mesh_shape: Sequence[int],
        dcn_mesh_shape: Sequence[int] | None = None,
        axis_names: Sequence[str] | None = None,
        devices: Sequence[DeviceInfo] | None = None,
    ) -> None:
        if devices is None:
            devices = [DeviceInfo.from_attributes(i, a) for i, a in enumerate(torch_xla_backend.device_attributes())]
        super().__init__(
            ici_mesh_shape=ici_mesh_shape, dcn_mesh_shape=dcn_mesh_shape, axis_names=axis_names, devices=devices
        )


def get_1d_mesh(axis_name: str | None = None, num_devices: int | None = None) -> Mesh:
    """A one-axis mesh over all the backend's devices (or ``num_devices``): torch_xla's
    ``get_1d_mesh``."""
    count = backend_for().device_count() if num_devices is None else num_devices
    return Mesh.of(_mesh.get_1d_mesh(axis_name, count))


class TorchXlaGlobalMesh:
    """torch_xla's global mesh as a follower of ours (`mesh.follow_global_mesh`)."""

    def set(self, mesh: _mesh.Mesh | None) -> None:
        """Make torch_xla's global mesh ``mesh``, as a mesh with the methods torch_xla calls."""
        torch_xla_backend.mirror_global_mesh(None if mesh is None else Mesh.of(mesh))

    def current(self) -> _mesh.Mesh | None:
        """torch_xla's global mesh (ours, or one torch_xla's own ``set_global_mesh`` set)."""
        theirs = torch_xla_backend.global_mesh()
        return None if theirs is None else as_mesh(theirs, "torch_xla's global mesh")
