"""shard_parameters on torch_xla: in place, the same parameters, specs by name or function, errors.
(On DTensor, with tied weights and buffers: tests/workers/dtensor_worker.py.)"""

import numpy as np
import pytest
import torch

from mesh import Mesh
from spmd import P, ShardingError, SpmdTypeError, UnknownAxisError, get_sharding, hlo_sharding_for, shard_parameters

MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))


def mlp(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).to(device)


def test_shards_in_place_by_name_and_output_is_unchanged(xla):
    ref = mlp("cpu")
    model = mlp(xla)
    before = [id(p) for p in model.parameters()]
    assert shard_parameters(model, MESH, {"0.weight": P("model", None), "2.weight": P(None, "model")}) is model
    assert [id(p) for p in model.parameters()] == before  # the same nn.Parameter objects
    assert get_sharding(model[0].weight) == hlo_sharding_for(MESH, P("model", None), 2)
    assert get_sharding(model[2].weight) == hlo_sharding_for(MESH, P(None, "model"), 2)
    x = torch.randn(8, 16)
    torch.testing.assert_close(model(x.to(xla)).cpu(), ref(x), rtol=1e-5, atol=1e-5)


def test_specs_from_a_function(xla):
    model = mlp(xla)
    shard_parameters(model, MESH, lambda name, p: P("model") if name.endswith("bias") else None)
    assert get_sharding(model[0].bias) == hlo_sharding_for(MESH, P("model"), 1)
    assert get_sharding(model[0].weight) is None or get_sharding(model[0].weight).is_replicated


def test_bad_input_is_refused(xla):
    with pytest.raises(ShardingError, match=r"has no parameters \['0.wieght'\].*'0.weight'"):
        shard_parameters(mlp(xla), MESH, {"0.wieght": P("model")})
    with pytest.raises(SpmdTypeError, match="takes an nn.Module, got Tensor"):
        shard_parameters(torch.zeros(2), MESH, {})
    with pytest.raises(SpmdTypeError, match="mapping .* or a function"):
        shard_parameters(mlp(xla), MESH, [("0.weight", P("model"))])


def test_a_refused_call_shards_no_parameter(xla):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(xla)
    with pytest.raises(UnknownAxisError, match="mesh axis 'zz' is not in the mesh"):
        shard_parameters(model, MESH, {"0.weight": P("data"), "1.weight": P("zz")})
    assert get_sharding(model[0].weight) is None
