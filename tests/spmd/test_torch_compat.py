"""The private torch symbols spmd._util.torch_compat reaches for are where it looks, on this lane's
torch: when an upgrade moves one, the failing test names it and the function to change. (What
they do is tested where they are used: FSDP over flattened and 2-D meshes in
tests/fsdp_xla/test_fsdp_axes_dtensor.py, on torch 2.9 and 2.15.)"""

import inspect

import pytest
from torch.distributed.device_mesh import DeviceMesh

from spmd._util import torch_compat


def test_device_mesh_flatten_is_there():
    flatten = getattr(DeviceMesh, "_flatten", None)
    assert flatten is not None, (
        f"torch {torch_compat.TORCH_VERSION} has no DeviceMesh._flatten: update torch_compat.flatten_device_mesh "
        "(FSDP over several mesh axes)."
    )
    assert "mesh_dim_name" in inspect.signature(flatten).parameters, (
        "DeviceMesh._flatten no longer takes mesh_dim_name: update torch_compat.flatten_device_mesh."
    )


@pytest.mark.skipif(torch_compat.TORCH_VERSION < (2, 11), reason="torch 2.9 slices the root by a flattened name")
def test_device_mesh_concatenate_is_there_where_root_slicing_is_deprecated():
    concatenate = getattr(DeviceMesh, "_concatenate", None)
    assert concatenate is not None, (
        f"torch {torch_compat.TORCH_VERSION} has no DeviceMesh._concatenate: update "
        "torch_compat.replicate_shard_mesh (HSDP over a flattened dim)."
    )
    assert list(inspect.signature(concatenate).parameters) == ["device_mesh_list"], (
        "DeviceMesh._concatenate takes other arguments now: update torch_compat.replicate_shard_mesh."
    )
