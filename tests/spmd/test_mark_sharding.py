"""mark_sharding on torch_xla: numerics against unsharded runs, shards, constraints, errors."""

import numpy as np
import pytest
import torch

from mesh import DeviceCountError, Mesh, set_global_mesh, use_mesh
from spmd import (
    DuplicateAxisError,
    NoMeshError,
    NotAnXlaTensorError,
    P,
    ShardedTensor,
    ShardingConflictError,
    ShardingError,
    SpmdTypeError,
    UnknownAxisError,
    clear_sharding,
    get_sharding,
    hlo_sharding_for,
    mark_sharding,
    mark_sharding_with_gradients,
    shard_as,
    with_sharding_constraint,
)
from spmd._backend import torch_xla_backend

MESH_2D = Mesh(np.arange(8), (4, 2), ("data", "model"))
MESH_3D = Mesh(np.arange(8), (2, 2, 2), ("x", "y", "z"))


def to_xla(t, device, mesh, spec):
    x = t.to(device)
    mark_sharding(x, mesh, spec)
    return x


@pytest.mark.parametrize(
    "mesh, a_spec, b_spec",
    [
        (MESH_2D, P("data", None), P(None, "model")),
        (MESH_2D, P("data", "model"), P("model", None)),  # contraction dim sharded: all-reduce
        (MESH_2D, P(None, ("data", "model")), P(("data", "model"), None)),
        (MESH_3D, P(("x", "y"), "z"), P("z", None)),
        (MESH_3D, P("x", None), P(None, ("z", "y"))),
    ],
)
def test_matmul_matches_unsharded(xla, mesh, a_spec, b_spec):
    torch.manual_seed(0)
    a, b = torch.randn(16, 24), torch.randn(24, 8)
    out = to_xla(a, xla, mesh, a_spec) @ to_xla(b, xla, mesh, b_spec)
    torch.testing.assert_close(out.cpu(), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mesh, spec", [(MESH_2D, P("model", "data")), (MESH_3D, P("z", ("x", "y"), None))])
def test_elementwise_and_reductions_match_unsharded(xla, mesh, spec):
    torch.manual_seed(1)
    shape = (8, 8) if len(spec) == 2 else (4, 8, 6)
    x, y = torch.randn(shape), torch.randn(shape)
    xs, ys = to_xla(x, xla, mesh, spec), to_xla(y, xla, mesh, spec)
    torch.testing.assert_close((torch.sin(xs) * ys + 1).cpu(), torch.sin(x) * y + 1)
    torch.testing.assert_close(xs.sum(dim=0).cpu(), x.sum(dim=0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xs.amax(dim=-1).cpu(), x.amax(dim=-1))
    torch.testing.assert_close(xs.mean().cpu(), x.mean(), rtol=1e-5, atol=1e-6)


def test_uneven_shapes_are_padded_and_reported(xla):
    t = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3)
    view = mark_sharding(t.to(xla), MESH_2D, P("data"))
    assert view.padding == (2, 0)
    shards = view.local_shards
    assert [s.device for s in shards] == list(range(8))
    for s in shards:
        assert s.padded_shape == (3, 3) and s.data.shape == (3, 3)  # torch_xla's meaning: padded
        torch.testing.assert_close(s.unpadded_data, t[s.index])
        assert s.indices == [slice(s.index[0].start, s.index[0].stop, 1), slice(0, 3, 1)]
    assert shards[6].index[0] == slice(9, 10) and shards[6].unpadded_data.shape == (1, 3)
    torch.testing.assert_close(shards[6].data[1:], torch.zeros(2, 3))  # XLA's padding
    assert [s.replica_id for s in shards[:2]] == [0, 1]
    torch.testing.assert_close((view.global_tensor * 2).cpu(), t * 2)


def test_local_shard_indices_agree_with_torch_xla(xla):
    import torch_xla

    t = torch.randn(6, 10).to(xla)
    view = mark_sharding(t, MESH_3D, P(("z", "x"), "y"))
    theirs = torch_xla._XLAC._get_local_shard_replica_and_indices([t])[0]
    for ours, (replica, indices) in zip(view.local_shards, theirs):
        assert ours.replica_id == replica
        assert [(s.start, s.stop) for s in ours.index] == [(s.start, s.stop) for s in indices]


def test_view_reports_sharding(xla):
    t = torch.zeros(8, 4).to(xla)
    view = mark_sharding(t, MESH_2D, ("data", None))
    assert isinstance(view, ShardedTensor) and isinstance(view, torch.Tensor)
    assert view.global_tensor is t
    assert view.global_shape == (8, 4)
    assert view.sharding.spec == P("data", None)
    assert view.sharding_spec == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert str(get_sharding(t)) == view.sharding_spec
    assert repr(view) == f"XLAShardedTensor({t})"  # torch_xla's text; sharding_spec has the layout


def test_parameters_can_be_sharded(xla):
    lin = torch.nn.Linear(8, 16).to(xla)
    mark_sharding(lin.weight, MESH_2D, P("model", None))
    assert str(get_sharding(lin.weight)) == "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"
    assert isinstance(lin.weight, torch.nn.Parameter)


def test_remark_same_is_noop_different_raises_or_replaces(xla):
    x = torch.arange(16.0).reshape(4, 4)
    t = x.to(xla)
    mark_sharding(t, MESH_2D, P("data"))
    mark_sharding(t, MESH_2D, P("data"))
    with pytest.raises(ShardingConflictError, match=r"already sharded as .*Pass replace=True to reshard it"):
        mark_sharding(t, MESH_2D, P(None, "model"))
    with pytest.raises(RuntimeError):  # what torch_xla raises there, for scripts that catch it
        mark_sharding(t, MESH_2D, P(None, "model"))
    mark_sharding(t, MESH_2D, P(None, "model"), replace=True)
    assert str(get_sharding(t)) == "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"
    torch.testing.assert_close(t.cpu(), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_alternating_replace_compiles_once_per_layout(xla, dtype):
    """mark_sharding(..., replace=True) between two layouts, as a training loop does: the reshard
    runs in the step's graph (2 variants, cached), not as torch_xla's ReshardData, which compiles
    anew on every call (measured: 20 compiles in 20 steps before, 3 now)."""
    import torch_xla

    torch.manual_seed(0)
    host = (torch.randn(16, 16) * 4).to(dtype)
    w = host.to(xla)
    specs = [P("data", "model"), P("model", "data")]
    before = torch_xla_backend.compile_count()
    for i in range(12):
        mark_sharding(w, MESH_2D, specs[i % 2], replace=True)
        assert get_sharding(w) == hlo_sharding_for(MESH_2D, specs[i % 2], 2)
        w = w | w if dtype == torch.bool else w * 1 + 0
        torch_xla.sync()
    assert torch_xla_backend.compile_count() - before <= 3  # the two step variants (+ the first layout's)
    assert torch.equal(w.cpu(), host)


def test_replace_on_a_parameter_keeps_it_a_leaf_with_its_values(xla):
    import torch_xla

    param = torch.nn.Parameter(torch.randn(8, 4).to(xla))
    mark_sharding(param, MESH_2D, P("data"))
    torch_xla.sync()
    expected = param.detach().cpu()
    mark_sharding(param, MESH_2D, P(None, "model"), replace=True)
    assert param.is_leaf and param.requires_grad
    assert get_sharding(param) == hlo_sharding_for(MESH_2D, P(None, "model"), 2)
    (param * 2).sum().backward()
    assert torch.equal(param.detach().cpu(), expected) and torch.equal(param.grad.cpu(), torch.full((8, 4), 2.0))


def test_clear_sharding(xla):
    t = torch.ones(8, 8).to(xla)
    mark_sharding(t, MESH_2D, P("data", "model"))
    assert clear_sharding(t) is t
    assert get_sharding(t) is None
    mark_sharding(t, MESH_2D, P("model"))
    with pytest.raises(NotAnXlaTensorError):
        clear_sharding(torch.ones(2))


def test_intermediate_becomes_a_constraint(xla):
    a = torch.ones(8, 8).to(xla)
    b = a * 2
    mark_sharding(b, MESH_2D, P("data", "model"))
    hlo = torch_xla_backend.tensors_hlo_text([b + 1])
    assert 'custom_call_target="Sharding", sharding={devices=[4,2]0,1,2,3,4,5,6,7}' in hlo


def test_with_sharding_constraint_leaves_input_alone(xla):
    a = torch.ones(8, 8).to(xla) + 1
    b = with_sharding_constraint(a, MESH_2D, P(None, "model"))
    assert "Sharding" in torch_xla_backend.tensors_hlo_text([b])
    assert "Sharding" not in torch_xla_backend.tensors_hlo_text([a])
    torch.testing.assert_close(b.cpu(), torch.full((8, 8), 2.0))


def test_mark_sharding_with_gradients_constrains_backward(xla):
    w = torch.randn(8, 8, device=xla, requires_grad=True)
    h = mark_sharding_with_gradients(w * 3, MESH_2D, P("data", None))
    h.sum().backward()
    hlo = torch_xla_backend.tensors_hlo_text([w.grad])
    assert hlo.count('custom_call_target="Sharding", sharding={devices=[4,1,2]') == 1
    torch.testing.assert_close(w.grad.cpu(), torch.full((8, 8), 3.0))


def test_remark_over_replicated_reshards(xla):
    x = torch.arange(16.0).reshape(4, 4)
    t = x.to(xla)
    mark_sharding(t, MESH_2D, P())  # explicitly replicated
    assert str(get_sharding(t)) == "{replicated}"
    mark_sharding(t, MESH_2D, P("data", "model"))  # permitted without replace=True, as in torch_xla
    assert str(get_sharding(t)) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    u = x.to(xla)
    out = (u @ u).relu()  # a step's output carries {replicated} once computed
    torch_xla_sync()
    assert str(get_sharding(out)) == "{replicated}"
    view = mark_sharding(out, MESH_2D, P("model"))
    assert view.sharding_spec == "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"
    torch.testing.assert_close(view.cpu(), (x @ x).relu())


def torch_xla_sync():
    import torch_xla

    torch_xla.sync()


def test_global_mesh_used_when_mesh_is_none(xla):
    t = torch.zeros(8).to(xla)
    with pytest.raises(NoMeshError, match="no global mesh is set"):
        mark_sharding(t, None, P("data"))
    with use_mesh(MESH_2D):
        assert mark_sharding(t, None, P("data")).sharding.mesh is MESH_2D
    set_global_mesh(None)


def test_input_errors(xla):
    with pytest.raises(
        NotAnXlaTensorError,
        match=r"tensor of shape \(3,\), spec P\('data'\), mesh\{.*\): it is on device 'cpu'.*\.to\(torch_xla.device\(\)\)",
    ):
        mark_sharding(torch.ones(3), MESH_2D, P("data"))
    with pytest.raises(RuntimeError, match="not an XLA device"):  # what torch_xla raises: old except clauses hold
        mark_sharding(torch.ones(3), MESH_2D, P("data"))
    with pytest.raises(UnknownAxisError, match=r"shape \(8, 8\), spec P\('batch'\)"):
        mark_sharding(torch.ones(8, 8).to(xla), MESH_2D, P("batch"))
    big = Mesh(np.arange(16), (8, 2), ("data", "model"))
    with pytest.raises(
        DeviceCountError, match=r"shape \(8,\), spec P\('data'\).*uses device ids \[8, .*runtime has only 8 device"
    ):
        mark_sharding(torch.ones(8).to(xla), big, P("data"))
    small = Mesh(np.arange(4), (4,), ("data",))
    with pytest.raises(DeviceCountError, match="mesh has 4 devices but the runtime has 8.*range\\(8\\)"):
        mark_sharding(torch.ones(8).to(xla), small, P("data"))
    with pytest.raises(TypeError, match="expects a mesh.Mesh"):
        mark_sharding(torch.ones(8).to(xla), (4, 2), P("data"))
    with pytest.raises(TypeError, match="torch.Tensor"):
        mark_sharding(np.ones(8), MESH_2D, P("data"))
    with pytest.raises(
        DuplicateAxisError,
        match=r"mark_sharding\(tensor of shape \(8, 8\), over mesh\{'data': 4, 'model': 2\}\).*more than once",
    ):
        mark_sharding(torch.ones(8, 8).to(xla), MESH_2D, ("data", "data"))


@pytest.mark.parametrize("replace", ["no", None, 1])
def test_replace_takes_a_bool(replace):
    with pytest.raises(SpmdTypeError, match="replace takes True or False"):
        mark_sharding(torch.zeros(8, 4), MESH_2D, P("data"), replace=replace)


def test_shard_as_checks_its_pairs_and_runs_on_the_lane_as_installed(xla):
    with pytest.raises(ShardingError, match=r"tensors of shape \(4,\) and \(8,\).*differ in shape"):
        shard_as(torch.zeros(4).to(xla), torch.zeros(8).to(xla))
    with pytest.raises(NotAnXlaTensorError, match="on device 'cpu'"):
        shard_as(torch.zeros(4), torch.zeros(4))
    a = mark_sharding(torch.randn(8, 4).to(xla), MESH_2D, P("data"))
    x, y = shard_as(a * 2, torch.ones(8, 4).to(xla))  # through torch_xla's JAX bridge (torchax, no flax)
    assert tuple(x.shape) == tuple(y.shape) == (8, 4)
    torch.testing.assert_close(x.cpu(), a.cpu() * 2)


def test_one_mark_sharding_converts_its_spec_and_computes_its_hlo_sharding_once(xla, monkeypatch):
    """Check once, convert once: the spec is read from its tuple once and the HLO sharding
    computed once (resolve_sharding and NamedSharding's own check each computed it)."""
    import spmd.sharding._named_sharding as named
    from spmd import PartitionSpec

    calls = {"hlo": 0, "from_value": 0}
    compute, from_value = named._compute_hlo_sharding, PartitionSpec.from_value

    def counted_compute(*args):
        calls["hlo"] += 1
        return compute(*args)

    def counted_from_value(spec):
        calls["from_value"] += 1
        return from_value(spec)

    monkeypatch.setattr(named, "_compute_hlo_sharding", counted_compute)
    monkeypatch.setattr(PartitionSpec, "from_value", staticmethod(counted_from_value))
    named._cached_hlo_sharding.cache_clear()
    named._check_spec_on_mesh.cache_clear()
    x = mark_sharding(torch.zeros(8, 6).to(xla), MESH_2D, ("data", None))
    assert calls == {"hlo": 1, "from_value": 1}
    assert x.sharding.spec == PartitionSpec("data", None)
    mark_sharding(torch.zeros(8, 6).to(xla), MESH_2D, PartitionSpec("data", None))
    assert calls == {"hlo": 1, "from_value": 2}  # once per call; the same (mesh, spec, shape): from the cache
