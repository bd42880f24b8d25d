"""ShardingSpec: torch_xla's data loaders send each batch straight to the devices as shards."""

import numpy as np
import pytest
import torch

from mesh import Mesh
from spmd import P, ShardingError, ShardingSpec, SpmdTypeError, UnknownAxisError, get_sharding, mark_sharding

MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))


def test_send_cpu_data_to_device_equals_mark_sharding(xla):
    import torch_xla.core.xla_model as xm

    tensor = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    spec = ShardingSpec(MESH, ("data", None))
    assert spec.can_apply(tensor) and spec.can_apply(torch.zeros(8)) and not spec.can_apply(torch.zeros(()))
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
        # rank 1: its batch dim split too (torch_xla sends it replicated, silently)
        assert str(get_sharding(y)) == "{devices=[4,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
        torch.testing.assert_close(x.cpu(), hx)
        torch.testing.assert_close(y.cpu(), hy)


def test_bad_spec_fails_when_built():
    with pytest.raises(UnknownAxisError, match="'batch' is not in the mesh"):
        ShardingSpec(MESH, ("batch", None))
    with pytest.raises(TypeError, match="needs a mesh.Mesh"):
        ShardingSpec((4, 2), ("data", None))


def test_a_spec_that_splits_a_dim_a_tensor_lacks_is_an_error_not_replication(xla):
    spec = ShardingSpec(MESH, (None, "data"))
    with pytest.raises(ShardingError, match=r"splits dim 1, but a batch tensor has shape \(8,\): it would be sent"):
        spec.xla_spec(torch.zeros(8))
    assert ShardingSpec(MESH, ("data",)).spec_for(torch.zeros(8, 3, 4, 4)) == P("data")  # 4-D masks: the batch dim
    assert ShardingSpec(MESH, ("data", None)).spec_for(torch.zeros(())) is None  # a scalar: replicated


def test_minibatch_takes_a_bool_and_a_batch_is_tensors():
    with pytest.raises(SpmdTypeError, match="minibatch takes True or False, got 'no'"):
        ShardingSpec(MESH, ("data", None), minibatch="no")
    with pytest.raises(SpmdTypeError, match="lays out tensors, got 'x'"):
        ShardingSpec(MESH, ("data", None)).can_apply("x")
