"""torch_xla's ``torch_xla.distributed.spmd.api``: its DTensor-style helpers, on our API.

``from torch_xla.distributed.spmd.api import ...`` becomes ``from spmd.api import ...``.
`convert_to_xla_mesh` returns our `Mesh` (torch_xla's returns its own), `xla_distribute_tensor`
and `xla_distribute_module` are `spmd.distribute_tensor` and `spmd.distribute_module` with
torch_xla's signatures, and `convert_to_xla_partition_spec` is `spmd.sharding`' rule with
torch_xla's integer entries. The differences from torch_xla are in docs/migration.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mesh import DeviceCountError, Mesh
from mesh.checks import summarize_ids
from spmd._backend import backend_for
from spmd.compat.xla_mesh import Mesh as XlaMesh
from spmd.distribute import distribute_module, distribute_tensor
from spmd.errors import PlacementError, SpmdTypeError
from spmd.sharding import spec_from_placements

__all__ = [
    "MeshSizeError",
    "auto_policy",
    "convert_to_xla_mesh",
    "convert_to_xla_partition_spec",
    "xla_distribute_module",
    "xla_distribute_tensor",
]


class MeshSizeError(DeviceCountError, AssertionError):
    """A ``DeviceMesh`` whose size is not the backend's device count. Also an
    ``AssertionError``, which torch_xla raises here, so its scripts' ``except`` clauses hold."""


def convert_to_xla_mesh(dt_mesh: Any) -> Mesh:
    """A ``DeviceMesh`` (``DeviceMesh("xla", ...)``) as our `Mesh`: the same ids, shape and
    names, with torch_xla's mesh methods.

    Raises:
        MeshSizeError: the DeviceMesh does not cover the backend's devices.
        MeshTypeError: ``dt_mesh`` is not a DeviceMesh.
    """
    mesh = Mesh.from_device_mesh(dt_mesh)  # checks it is a DeviceMesh before asking anything of it
    available = backend_for().device_count()
    if mesh.size() != available:
        raise MeshSizeError(
            f"convert_to_xla_mesh: the DeviceMesh has {mesh.size()} devices ({summarize_ids(mesh.device_ids.tolist())}) "
            f"but the runtime has {available}; every program is partitioned over all of them. Build the DeviceMesh "
            f"over range({available})."
        )
    return XlaMesh.of(mesh)


def convert_to_xla_partition_spec(tensor: torch.Tensor, placements: Sequence[Any]) -> tuple:
    """torch_xla's partition spec (mesh axis indices per tensor dim) of DTensor ``placements``:
    ``[Replicate(), Shard(0)]`` is ``(1, None, ...)``. Several ``Shard`` on one dim give a tuple
    of axes in mesh order (torch_xla keeps only the last).

    Raises:
        PlacementError: a placement other than ``Shard``/``Replicate`` (a ``ValueError``).
        SpmdTypeError: ``tensor`` is not a tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise SpmdTypeError(
            f"convert_to_xla_partition_spec(tensor, placements) needs a tensor first (for its rank), got "
            f"{tensor!r:.80} ({type(tensor).__name__})."
        )
    if isinstance(placements, (str, bytes)) or not isinstance(placements, Sequence):
        raise PlacementError(f"placements are a sequence of Shard(dim)/Replicate(), got {placements!r:.80}.")
    # Only the axis count matters for integer entries: a mesh of that many size-1 axes stands in.
    mesh = Mesh(range(1), (1,) * max(len(placements), 1))
    return tuple(spec_from_placements(placements, mesh, tensor.dim(), by_index=True).padded(tensor.dim()))


def xla_distribute_tensor(tensor: torch.Tensor, device_mesh: Any, placements: Sequence[Any] | None = None) -> Any:
    """torch_xla's ``xla_distribute_tensor``: `spmd.distribute_tensor`."""
    return distribute_tensor(tensor, device_mesh, placements)


def auto_policy(mod_name: str, mod: torch.nn.Module, mesh: Any) -> None:
    """torch_xla's marker for its auto-sharding pass. Not supported here: passing it to
    `xla_distribute_module` raises."""


def xla_distribute_module(
    module: torch.nn.Module,
    device_mesh: Any = None,
    partition_fn: Any = None,
    input_fn: Any = None,
    output_fn: Any = None,
) -> torch.nn.Module:
    """torch_xla's ``xla_distribute_module``: `spmd.distribute_module`.

    Raises:
        SpmdTypeError: ``partition_fn=auto_policy`` (torch_xla's experimental auto-sharding,
            which we do not run; give a partition function).
    """
    if partition_fn is auto_policy:
        raise SpmdTypeError(
            "xla_distribute_module(partition_fn=auto_policy): torch_xla's auto-sharding pass is not supported; "
            "give a partition_fn that lays parameters out (spmd.shard_parameters), or none to replicate them."
        )
    return distribute_module(module, device_mesh, partition_fn, input_fn, output_fn)
