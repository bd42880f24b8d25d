"""DTensor's layout record for a GSPMD tensor: an ``xla`` ``DeviceMesh`` of our `Mesh` and a
``DTensorSpec`` of (tensor, mesh, spec), as torch_xla 2.9's ``XLAShardedTensor._spec`` gives it."""

from __future__ import annotations

from typing import Any

import torch

from mesh import Mesh
from spmd.sharding import PartitionSpec, placements_from_spec

__all__ = ["dtensor_spec", "xla_device_mesh"]


def dtensor_spec(tensor: torch.Tensor, mesh: Mesh, spec: PartitionSpec) -> Any:
    """The ``DTensorSpec`` of ``tensor`` laid out as ``spec`` over ``mesh``: its placements, an
    ``xla`` DeviceMesh of the mesh, and the tensor's shape, stride and dtype.

    Raises:
        ShardingError: the spec does not fit the mesh or the tensor.
    """
    from spmd._util.torch_compat import DTensorSpec, TensorMeta

    meta = TensorMeta(shape=tensor.shape, stride=tensor.stride(), dtype=tensor.dtype)
    placements = placements_from_spec(spec, mesh, tensor.dim())
    return DTensorSpec(xla_device_mesh(mesh), placements, tensor_meta=meta)


def xla_device_mesh(mesh: Mesh) -> Any:
    """``mesh`` as an ``xla`` ``DeviceMesh`` (its ids, order and axis names; unnamed axes are
    ``axis0``, ``axis1``, ...), built once per mesh."""
    built = mesh.memo.get("xla_device_mesh")
    if built is None:
        from torch.distributed.device_mesh import DeviceMesh

        names = mesh.axis_names or tuple(f"axis{i}" for i in range(mesh.ndim))
        built = DeviceMesh("xla", torch.as_tensor(mesh.get_logical_mesh()), mesh_dim_names=names)
        mesh.memo["xla_device_mesh"] = built
    return built
