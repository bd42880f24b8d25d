"""The only runtime calls of the mesh package: device attributes and torch_xla's global mesh
(public torch_xla API only; `_XLAC` and the device count live in the spmd backends)."""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["runtime_device_attributes", "mirror_global_mesh", "runtime_global_mesh"]


def runtime_device_attributes() -> list[dict]:
    """Per-device attributes (``coords``, ``core_on_chip``, ``slice_index`` on TPU)."""
    import torch_xla.runtime as xr

    return list(xr.global_runtime_device_attributes())


def mirror_global_mesh(mesh: object | None) -> None:
    """Make torch_xla's global mesh this very mesh object (``None`` clears it).

    Our `Mesh` has every method torch_xla's code calls on a mesh (``get_op_sharding``,
    ``get_axis_name_idx``, ``mesh_shape``, ``axis_names``, ``shape()``, ``size()``...), and
    torch_xla checks no mesh's type, so torch_xla's FSDPv2 and the Hugging Face Trainer's XLA
    path use it as it is; ``id(their_mesh) == id(ours)``, as torch_xla's own tests expect.
    """
    if mesh is None:
        module = sys.modules.get("torch_xla.distributed.spmd.xla_sharding")
        if module is not None:
            module.set_global_mesh(None)
        return
    if importlib.util.find_spec("torch_xla") is None:  # a backend without torch_xla
        return
    # Importing torch_xla does not start its runtime; it only makes the setter reachable.
    import torch_xla.distributed.spmd.xla_sharding as xla_sharding

    xla_sharding.set_global_mesh(mesh)


def runtime_global_mesh() -> object | None:
    """torch_xla's global mesh (ours, or a torch_xla ``Mesh`` set by torch_xla's own
    ``set_global_mesh``), or ``None``."""
    module = sys.modules.get("torch_xla.distributed.spmd.xla_sharding")
    return None if module is None else module.get_global_mesh()
