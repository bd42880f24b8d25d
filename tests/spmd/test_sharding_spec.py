"""ShardingSpec: torch_xla's data loaders send each batch straight to the devices as shards."""

import numpy as np
import pytest
import torch

from mesh import Mesh
from spmd import ShardingSpec, UnknownAxisError, get_sharding, mark_sharding

MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))


def test_send_cpu_data_to_device_equals_mark_sharding(xla):
    import torch_xla.core.xla_model as xm

    tensor = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    spec = ShardingSpec(MESH, ("data", None))
    assert spec.can_apply(tensor) and not spec.can_apply(torch.zeros(8))
    (sent,) = xm.send_cpu_data_to_device([tensor], xla, input_sharding=spec)
    explicit = tensor.to(xla)
    mark_sharding(explicit, MESH, ("data", None))
    assert get_sharding(sent) == get_sharding(explicit)
    torch.testing.assert_close(sent.cpu(), tensor)


def test_mp_device_loader_shards_each_batch(xla):
    import torch_xla.distributed.parallel_loader as pl

    data = [(torch.randn(16, 4), torch.arange(16)) for _ in range(2)]
    loader = pl.MpDeviceLoader(data, xla, input_sharding=ShardingSpec(MESH, ("data", None)))
    for (x, y), (hx, hy) in zip(loader, data):
        assert str(get_sharding(x)) == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
        assert get_sharding(y) is None or get_sharding(y).is_replicated  # rank 1: sent replicated
        torch.testing.assert_close(x.cpu(), hx)
        torch.testing.assert_close(y.cpu(), hy)


def test_bad_spec_fails_when_built():
    with pytest.raises(UnknownAxisError, match="'batch' is not in the mesh"):
        ShardingSpec(MESH, ("batch", None))
    with pytest.raises(TypeError, match="needs a mesh.Mesh"):
        ShardingSpec((4, 2), ("data", None))
