"""DTensor's vocabulary on torch_xla (spmd.distribute, XLAShardedTensor's DTensor methods); the
same calls on DTensor run in examples/one_script.py under torchrun (tests/test_examples.py)."""

import numpy as np
import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

import spmd
from mesh import Mesh, MeshTypeError
from spmd import P, SpmdTypeError, XLAShardedTensor, get_sharding, mark_sharding

MESH = Mesh(np.arange(8), (2, 4), ("data", "model"))


def test_init_device_mesh_and_mesh_conversions_both_ways(xla):
    dm = spmd.init_device_mesh((2, 4), ("data", "model"))
    assert dm.device_type == "xla" and tuple(dm.mesh.shape) == (2, 4) and dm.mesh_dim_names == ("data", "model")
    assert Mesh.from_device_mesh(dm) == MESH
    assert Mesh.from_device_mesh(spmd.device_mesh(MESH)) == MESH
    assert spmd.device_count() == 8


def test_distribute_tensor_with_placements_equals_mark_sharding_with_the_spec(xla):
    host = torch.arange(64.0).reshape(8, 8)
    dm = spmd.init_device_mesh((2, 4), ("data", "model"))
    x = spmd.distribute_tensor(host, dm, [Shard(0), Replicate()])
    assert isinstance(x, XLAShardedTensor) and x.device.type == "xla"
    y = mark_sharding(host.clone().to(xla), MESH, P("data"))
    assert get_sharding(x) == get_sharding(y)
    assert x.placements == (Shard(0), Replicate())
    assert torch.equal(x.full_tensor().cpu(), host)
    z = mark_sharding(host.clone().to(xla), MESH, [Replicate(), Shard(1)])  # placements where a spec goes
    assert z.sharding.spec == P(None, "model") and z.placements == (Replicate(), Shard(1))


def test_redistribute_constrains_and_keeps_the_value(xla):
    x = spmd.distribute_tensor(torch.arange(64.0).reshape(8, 8), MESH, P("data"))
    y = x.redistribute(MESH, [Replicate(), Shard(1)])
    assert y.partition_spec == (None, 1) and y.mesh_shape == (2, 4)  # torch_xla's integer entries
    assert y.global_tensor is x.global_tensor  # the same tensor, constrained (torch_xla's rule)
    z = x.redistribute(MESH, [Shard(1), Replicate()], async_op=True)
    assert z.global_tensor is not x.global_tensor and torch.equal(z.full_tensor().cpu(), x.cpu())
    spmd.step()
    assert "devices=[1,2,4]" in z.sharding_spec


def test_constructor_and_repr_are_torch_xlas(xla):
    t = torch.ones(4, 2).to(xla)
    wrapped = XLAShardedTensor(t, (2, 4), (0, None))
    assert wrapped.global_tensor is t and wrapped.mesh_shape == (2, 4) and wrapped.partition_spec == (0, None)
    assert wrapped.placements == (Shard(0), Replicate())
    assert repr(wrapped) == f"XLAShardedTensor({t})"
    with pytest.raises(ValueError, match="Placements not available"):
        _ = XLAShardedTensor(t).placements


def test_distribute_module_replicates_what_partition_fn_leaves(xla):
    calls = []

    def partition(name, module, mesh):
        calls.append(name)
        if name == "0":
            spmd.shard_parameters(module, mesh, {"weight": [Replicate(), Shard(0)]})

    seen = []
    model = spmd.distribute_module(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)),
        MESH,
        partition,
        input_fn=lambda mod, inputs, mesh: seen.append("in") or inputs,
        output_fn=lambda mod, outputs, mesh: seen.append("out") or outputs,
    )
    assert calls == ["", "0", "1"] and model[0].weight.device.type == "xla"
    assert get_sharding(model[0].weight) == get_sharding(mark_sharding(torch.zeros(16, 8).to(xla), MESH, P("model")))
    assert get_sharding(model[1].weight).is_replicated
    model(torch.ones(2, 8).to(xla))
    assert seen == ["in", "out"]
    with pytest.raises(TypeError, match="auto-sharding pass is not supported"):
        spmd.xla_distribute_module(torch.nn.Linear(2, 2), MESH, spmd.auto_policy)


def test_init_device_mesh_takes_an_int_shape_and_refuses_a_string_of_names(xla):
    assert tuple(spmd.init_device_mesh(8).mesh.shape) == (8,)
    with pytest.raises(MeshTypeError, match=r"mesh_dim_names is a tuple of names.*got the string 'ab'"):
        spmd.init_device_mesh((8,), "ab")


@pytest.mark.parametrize("what", ["partition_fn", "input_fn", "output_fn"])
def test_distribute_module_functions_are_checked_before_the_module_moves(what):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(SpmdTypeError, match=f"{what} is a function or None, got 5"):
        spmd.distribute_module(model, MESH, **{what: 5})
    assert model.weight.device.type == "cpu"


def test_convert_to_xla_mesh_needs_a_device_mesh():
    from spmd.compat.api import convert_to_xla_mesh

    with pytest.raises(MeshTypeError, match="takes a torch.distributed DeviceMesh, got str"):
        convert_to_xla_mesh("x")


class Refused(Exception):
    pass


def _fails_on_the_last_submodule(name, module, mesh):
    if name == "1":
        raise Refused("no layout for the second layer")
    if name == "0":
        spmd.shard_parameters(module, mesh, {"weight": P("model")})


def _state(model):
    """Which object sits under each parameter and buffer name, with its device and sharding."""
    return {
        name: (t, t.device.type, type(t), get_sharding(t) if t.device.type == "xla" else None)
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    }


@pytest.mark.parametrize("on_device", [False, True], ids=["on_the_host", "already_on_the_device"])
def test_a_partition_fn_failing_on_a_later_submodule_leaves_the_module_as_it_was(xla, on_device):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8))
    if on_device:
        model.to(xla)
    before = _state(model)
    with pytest.raises(Refused, match="no layout for the second layer"):
        spmd.distribute_module(model, MESH, _fails_on_the_last_submodule, input_fn=lambda m, i, mesh: i)
    after = _state(model)
    assert after.keys() == before.keys()
    for name, (t, device, kind, sharding) in before.items():
        assert after[name][0] is t and after[name][1:] == (device, kind, sharding), name
    assert not model._forward_pre_hooks  # no hook either
    spmd.distribute_module(model, MESH, lambda name, m, mesh: None)  # a retry works
    assert model[0].weight.device.type == "xla" and get_sharding(model[0].weight).is_replicated


def test_a_meta_tensor_is_refused_naming_the_fix_not_raised_from_inside_torch():
    with pytest.raises(SpmdTypeError, match=r"distribute_tensor: the tensor of shape \(4, 4\) is on the meta device.*"):
        spmd.distribute_tensor(torch.empty(4, 4, device="meta"), MESH, P("data"))
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with pytest.raises(SpmdTypeError, match=r"4 tensors of Sequential \(\['0.weight', '0.bias', '1.weight'\]\) are on"):
        spmd.distribute_module(model, MESH)
    assert model[0].weight.is_meta  # refused before anything moved
