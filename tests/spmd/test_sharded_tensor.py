"""What mark_sharding returns on torch_xla: a DTensor subclass view with shards and torch_xla's attributes."""

import numpy as np
import pytest
import torch

from mesh import Mesh, MeshError, MeshTypeError
from spmd import (
    P,
    PartitionSpecTypeError,
    ShardingType,
    ShardLoadError,
    XLAShardedTensor,
    get_sharding,
    mark_sharding,
    wrap_if_sharded,
)

MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))
MESH_1D = Mesh(np.arange(8), (8,), ("x",))


def test_the_result_is_a_tensor_the_model_can_use(xla):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    data = torch.randn(8, 16)
    expected = model(data)
    model.to(xla)
    x = mark_sharding(data.to(xla), MESH, ("data", None))
    assert isinstance(x, XLAShardedTensor) and isinstance(x, torch.Tensor)
    out = model(x)
    assert isinstance(out, XLAShardedTensor)  # results on the device stay sharded tensors
    host = out.cpu()
    assert type(host) is torch.Tensor  # a host copy is a plain tensor
    torch.testing.assert_close(host, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((x + 1).cpu(), data + 1)
    import torch_xla

    assert out.sharding is None and out.hlo_sharding is None  # traced: the compiler decides its layout
    torch_xla.sync()
    assert out.hlo_sharding is not None  # computed: not marked, but the runtime knows


def test_gradients_flow_to_the_marked_tensor(xla):
    w_host = torch.randn(8, 4)
    w = w_host.to(xla).requires_grad_(True)
    v = mark_sharding(w, MESH_1D, P("x"))
    assert v.requires_grad and v.global_tensor is w
    (v * v).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), 2 * w_host)

    lin = torch.nn.Linear(4, 2).to(xla)
    weight = mark_sharding(lin.weight, MESH, (None, "data"))
    assert isinstance(lin.weight, torch.nn.Parameter) and weight.global_tensor is lin.weight
    (weight.sum() * 3).backward()
    torch.testing.assert_close(lin.weight.grad.cpu(), torch.full((2, 4), 3.0))


def test_in_place_updates_reach_the_marked_tensor(xla):
    t = torch.zeros(8, 2).to(xla)
    v = mark_sharding(t, MESH, ("data", "model"))
    assert v.add_(2) is v
    v *= 3
    torch.testing.assert_close(t.cpu(), torch.full((8, 2), 6.0))
    assert get_sharding(t) is not None and v.sharding_spec == str(get_sharding(t))


def test_torch_xla_attributes(xla):
    import torch_xla

    t = torch.randn(8, 6).to(xla)
    v = mark_sharding(t, MESH, ("data", None))
    assert v.sharding_type is ShardingType.PARTIAL
    assert v.sharding_spec == torch_xla._XLAC._get_xla_sharding_spec(t)
    assert v.mesh_shape == (4, 2) and v.partition_spec == ("data", None)
    tiled = mark_sharding(torch.randn(8, 6).to(xla), MESH, ("data", "model"))
    assert tiled.sharding_type is ShardingType.TILED
    assert mark_sharding(torch.randn(3).to(xla), MESH, ()).sharding_type is ShardingType.REPLICATED


def test_local_shards_match_torch_xla(xla):
    import torch_xla

    t = torch.arange(6 * 10, dtype=torch.float32).reshape(6, 10)
    xt = t.to(xla)
    v = mark_sharding(xt, Mesh(np.arange(8), (2, 2, 2), ("x", "y", "z")), (("z", "x"), None))
    theirs = torch_xla._XLAC._get_local_shard_replica_and_indices([xt])[0]
    for shard, (replica, indices) in zip(v.local_shards, theirs):
        assert (shard.replica_id, shard.indices) == (replica, indices)
        torch.testing.assert_close(shard.unpadded_data, t[tuple(shard.indices)])
    replicated = mark_sharding(torch.arange(4.0).to(xla), MESH_1D, (None,))
    for i, shard in enumerate(replicated.local_shards):
        assert shard.indices is Ellipsis and shard.replica_id == i and shard.device == i
        torch.testing.assert_close(shard.data, torch.arange(4.0))


def test_load_local_shards_round_trip_and_errors(xla):
    t = torch.arange(10, dtype=torch.float32)  # 8-way split of 10: padded blocks of 2
    xt = t.to(xla)
    v = mark_sharding(xt, MESH_1D, ("x",))
    shards = v.local_shards
    for s in shards:
        s.unpadded_data = -s.unpadded_data
    v.load_local_shards_(shards)
    torch.testing.assert_close(v.cpu(), -t)
    torch.testing.assert_close(xt.cpu(), -t)  # the marked tensor sees the new data too
    with pytest.raises(ShardLoadError, match=r"got blocks for devices \[0, 1, 2, 3, 4, 5, 6\], need exactly one"):
        v.load_local_shards_(shards[:-1])
    with pytest.raises(RuntimeError):  # torch_xla's type, for scripts that catch it
        v.load_local_shards_(shards[:-1])
    shards[3].data = torch.zeros(4)
    with pytest.raises(ShardLoadError, match=r"block for CPU:3 has shape \(4,\); the device holds \(2,\)"):
        v.load_local_shards_(shards)
    rep = mark_sharding(torch.ones(4).to(xla), MESH_1D, (None,))
    with pytest.raises(ShardLoadError, match="replicated tensor has no per-device blocks"):
        rep.load_local_shards_(rep.local_shards)


def test_load_local_shards_refuses_another_dtype_and_changes_nothing(xla):
    t = torch.arange(16, dtype=torch.float32)
    v = mark_sharding(t.to(xla), MESH_1D, ("x",))
    shards = v.local_shards
    for s in shards:
        s.data = (s.data + 100).to(torch.float64)
    with pytest.raises(ShardLoadError, match="is torch.float64, the tensor torch.float32"):
        v.load_local_shards_(shards)
    torch.testing.assert_close(v.cpu(), t)


@pytest.mark.parametrize(
    "mesh_shape, spec, error, match",
    [
        ("abc", None, MeshTypeError, "mesh_shape must be a tuple of ints"),
        ((4, 0), None, MeshError, ">= 1"),
        (None, 5, PartitionSpecTypeError, r"got 5 \(int\)"),
        (None, ("x", 1.5), PartitionSpecTypeError, "1.5 \\(float\\) is not a mesh axis"),
    ],
)
def test_torch_xla_constructor_checks_what_it_records(mesh_shape, spec, error, match):
    with pytest.raises(error, match=match):
        XLAShardedTensor(torch.zeros(4), mesh_shape=mesh_shape, partition_spec=spec)
    assert XLAShardedTensor(torch.zeros(4), (8,), ("x",)).partition_spec == ("x",)


def test_wrap_if_sharded(xla):
    plain = torch.ones(4).to(xla)
    assert wrap_if_sharded(plain) is plain
    assert wrap_if_sharded(3) == 3
    mark_sharding(plain, MESH_1D, ("x",))
    wrapped = wrap_if_sharded(plain)
    assert isinstance(wrapped, XLAShardedTensor) and wrapped.global_tensor is plain


def test_visualize_a_computed_sharded_tensor(xla):
    import io

    from rich.console import Console

    from spmd import visualize_sharding

    x = mark_sharding(torch.ones(8, 4).to(xla), MESH, ("data", None))
    import torch_xla

    out = x * 2  # no mesh of its own: drawn from the runtime's sharding, once computed
    torch_xla.sync()
    buffer = io.StringIO()
    visualize_sharding(out, console=Console(file=buffer, width=120))
    text = buffer.getvalue()
    assert "(8, 4) sharded as computed" in text and "dev 0, 1" in text


# DTensor's interface, as torch_xla 2.9's XLAShardedTensor has it ------------------------------


def test_it_is_a_dtensor_with_its_spec(xla):
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    mesh = Mesh(np.arange(8)[::-1].copy(), (4, 2), ("data", "model"))  # ids out of order: kept
    x = mark_sharding(torch.randn(8, 6).to(xla), mesh, ("data", None))
    assert isinstance(x, DTensor) and isinstance(x, XLAShardedTensor)
    spec = x._spec
    assert isinstance(spec, DTensorSpec) and spec is x._spec  # cached
    assert spec.placements == (Shard(0), Replicate()) == x.placements
    assert spec.tensor_meta.shape == (8, 6) and spec.tensor_meta.dtype == torch.float32
    dm = x.device_mesh
    assert dm is spec.mesh and dm.device_type == "xla" and dm.mesh_dim_names == ("data", "model")
    assert dm.mesh.tolist() == mesh.get_logical_mesh().tolist()
    x.invalidate_spec_cache()
    assert x._cached_spec is None and x._spec is not spec and x._spec.placements == spec.placements


def test_its_spec_matches_torch_xlas_for_a_distributed_tensor(xla):
    from torch.distributed.tensor import DeviceMesh, Replicate, Shard
    from torch.distributed.tensor import distribute_tensor as torch_distribute_tensor

    import spmd

    dm = DeviceMesh("xla", torch.arange(8).reshape(2, 4))
    for placements in ([Shard(0), Shard(1)], [Shard(0), Replicate()], [Replicate(), Shard(1)]):
        t = torch.randn(16, 8)
        ours = spmd.distribute_tensor(t, dm, placements)
        theirs = torch_distribute_tensor(t, dm, placements)  # torch hands an xla mesh to torch_xla
        assert type(ours) is XLAShardedTensor and type(theirs).__module__.startswith("torch_xla")
        assert ours._spec.placements == theirs._spec.placements == tuple(placements)
        assert ours._spec.mesh.shape == theirs._spec.mesh.shape == (2, 4)
        assert ours._spec.tensor_meta == theirs._spec.tensor_meta
        assert ours.sharding_spec == theirs.sharding_spec


def test_autograd_through_the_constructor(xla):
    host = torch.randn(4, 4)
    leaf = XLAShardedTensor(host.to(xla), requires_grad=True)
    assert leaf.is_leaf and leaf.requires_grad
    (leaf * leaf).sum().backward()
    assert leaf.grad is not None and leaf.grad.shape == leaf.shape
    torch.testing.assert_close(leaf.grad.cpu(), 2 * host)

    w = host.to(xla).requires_grad_(True)
    attached = XLAShardedTensor(w, requires_grad=True)  # already in autograd: gradients reach w
    (attached * 3).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), torch.full((4, 4), 3.0))
    assert not XLAShardedTensor(w, requires_grad=False).requires_grad
    assert XLAShardedTensor(w).requires_grad
    with pytest.raises(TypeError, match="requires_grad must be True, False or None, got 'yes'"):
        XLAShardedTensor(w, requires_grad="yes")


def test_wrap_as_sharded_tensor_records_a_reshard(xla):
    from torch.distributed.tensor import Replicate, Shard

    from spmd.xla_sharding import wrap_as_sharded_tensor

    t = torch.randn(16, 8).to(xla)
    wrapped = wrap_as_sharded_tensor(t, mesh_shape=(8,), partition_spec=(0, None))
    assert wrapped.mesh_shape == (8,) and wrapped.partition_spec == (0, None)
    first = wrapped._spec
    assert first.placements == (Shard(0),)
    again = wrap_as_sharded_tensor(wrapped, mesh_shape=(2, 4))  # the spec recorded before stays
    assert again is wrapped and again.mesh_shape == (2, 4) and again.partition_spec == (0, None)
    assert again._spec is not first and again._spec.mesh.shape == (2, 4)
    assert again.placements == (Shard(0), Replicate())
    wrap_as_sharded_tensor(again, partition_spec=(0, 1))
    assert again.placements == (Shard(0), Shard(1))
    with pytest.raises(MeshError, match=">= 1"):
        wrap_as_sharded_tensor(again, mesh_shape=(0,))


def test_redistribute_keeps_mesh_shape_and_spec(xla):
    from torch.distributed.tensor import Replicate, Shard

    x = mark_sharding(torch.randn(8, 16).to(xla), MESH, ("data", None))
    moved = x.redistribute(placements=[Replicate(), Shard(1)])  # no mesh: its own, as DTensor's
    assert moved.mesh_shape == (4, 2) and moved.partition_spec == (None, 1)
    assert moved.placements == (Replicate(), Shard(1)) and moved.device_mesh.shape == (4, 2)
    with pytest.raises(ValueError, match=r"give the placements, one per mesh axis"):
        x.redistribute(MESH)
    with pytest.raises(ValueError, match="without a device_mesh: XLAShardedTensor requires mesh_shape"):
        (x + 1).redistribute(placements=[Replicate(), Replicate()])


def test_redistribute_checks_its_flag_and_the_mesh_s_devices(xla):
    from torch.distributed.tensor import Replicate

    from mesh import DeviceCountError, Mesh
    from spmd.errors import SpmdTypeError

    x = mark_sharding(torch.randn(8, 16).to(xla), MESH, ("data", None))
    with pytest.raises(SpmdTypeError, match=r"async_op must be True or False, got 'no'"):
        x.redistribute(placements=[Replicate(), Replicate()], async_op="no")  # was taken as True: a copy
    small = Mesh(np.arange(4), (4,), ("data",))
    with pytest.raises(DeviceCountError, match=r"the mesh has 4 devices but the runtime has 8"):
        x.redistribute(small, [Replicate()])  # reached torch_xla as a raw error


def test_what_it_cannot_answer_is_a_typed_error(xla):
    x = mark_sharding(torch.randn(8, 4).to(xla), MESH, ("data", None))
    result = x * 2  # a result of an op: no mesh or spec of its own, as torch_xla's
    with pytest.raises(ValueError, match="^DTensorSpec not available: XLAShardedTensor requires mesh_shape"):
        _ = result._spec
    with pytest.raises(ValueError, match="^Placements not available"):
        _ = result.placements
    with pytest.raises(TypeError, match=r"has no per-process local tensor on GSPMD.*full_tensor\(\)"):
        x.to_local()
    torch.testing.assert_close(x.full_tensor().cpu(), x.cpu())


def test_mark_sharding_returns_a_dtensor_on_the_dtensor_backend(tmp_path):
    """The current lane (torch.distributed): the value mark_sharding returns is torch's own DTensor."""
    from tests.torchrun import warm_launch

    script = tmp_path / "is_dtensor.py"
    script.write_text(DTENSOR_SCRIPT)
    run = warm_launch(script, 2, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.count("DTensor (Shard(dim=0),) 2 -> 4.0") == 2


DTENSOR_SCRIPT = """
import numpy as np, torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
from mesh import Mesh
from spmd import P, mark_sharding

dist.init_process_group("gloo")
x = mark_sharding(torch.ones(4), Mesh(np.arange(2), (2,), ("x",)), P("x"))
kind = type(x).__name__ if type(x) is DTensor else type(x)
# one write of one line: the ranks share the pipe, and print's pieces interleaved ("DTensorDTensor ...")
print(f"{kind} {x.placements} {x.to_local().numel()} -> {x.full_tensor().sum().item()}", flush=True)
dist.destroy_process_group()
"""
