"""torch_xla's mesh methods on spmd.Mesh (spmd.compat.xla_mesh), and one global mesh shared with torch_xla."""

import numpy as np
import pytest
import torch

from mesh import get_global_mesh, set_global_mesh
from spmd import HybridMesh, Mesh
from spmd.errors import UnknownAxisError

MESH = Mesh(np.arange(8)[::-1], (2, 2, 2), ("x", "y", "z"))


def test_axis_lookup_and_text_round_trip():
    assert MESH.get_axis_name_idx("y") == 1 and MESH.get_axis_name_idx("w") is None
    assert Mesh(np.arange(4), (4,)).get_axis_name_idx("x") is None
    assert (
        str(MESH) == "{'device_ids': [7, 6, 5, 4, 3, 2, 1, 0], 'mesh_shape': (2, 2, 2), 'axis_names': ('x', 'y', 'z')}"
    )
    assert Mesh.from_str(str(MESH)) == MESH
    assert Mesh.from_str("not a mesh") is None and Mesh.from_str("{'device_ids': [0, 0]}") is None


@pytest.mark.parametrize("spec", [("x", None), (("z", "x"), "y"), (None, None), ("y", "z", "x"), (1, None), ()])
def test_get_op_sharding_equals_torch_xla(xla, spec):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    theirs = xs.Mesh(np.arange(8)[::-1], (2, 2, 2), ("x", "y", "z"))
    shape = (4, 4, 4)[: len(spec)]
    texts = []
    for op in (MESH.get_op_sharding(spec), theirs.get_op_sharding(spec)):
        t = torch.zeros(shape).to(xla)
        torch_xla._XLAC._xla_mark_sharding(t, op)
        texts.append(torch_xla._XLAC._get_xla_sharding_spec(t))
    assert texts[0] == texts[1]
    assert MESH.get_op_sharding(spec) is MESH.get_op_sharding(spec)  # built once per mesh
    tile, groups, replication_groups, kind = MESH._get_op_sharding_args(spec)
    assert isinstance(tile, list) and isinstance(kind, int)


def test_get_op_sharding_rejects_a_bad_spec(xla):
    with pytest.raises(UnknownAxisError, match="'w' is not in the mesh"):
        MESH.get_op_sharding(("w",))


def test_global_mesh_is_torch_xla_global_mesh(xla):
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

    mesh = Mesh(np.arange(8), (8, 1), ("fsdp", "model"))
    set_global_mesh(mesh)
    assert xs.get_global_mesh() is mesh
    model = SpmdFullyShardedDataParallel(torch.nn.Linear(16, 8).to(xla))  # finds our mesh
    assert model._mesh is mesh
    out = model(torch.randn(8, 16).to(xla))
    assert out.shape == (8, 8)
    set_global_mesh(None)
    assert xs.get_global_mesh() is None and get_global_mesh() is None
    theirs = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    xs.set_global_mesh(theirs)  # set by torch_xla's own call: read back as ours
    assert get_global_mesh() == Mesh(np.arange(8), (4, 2), ("data", "model"))
    set_global_mesh(mesh)
    xs.set_global_mesh(theirs)  # after ours: the latest call wins, for both libraries
    assert get_global_mesh() == Mesh(np.arange(8), (4, 2), ("data", "model")) and xs.get_global_mesh() is theirs
    set_global_mesh(mesh)
    assert get_global_mesh() is mesh and xs.get_global_mesh() is mesh
    set_global_mesh(None)


def test_a_torch_xla_mesh_is_taken_where_a_mesh_is(xla):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    from spmd import mark_sharding

    theirs = xs.Mesh(np.arange(8)[::-1], (2, 2, 2), ("x", "y", "z"))
    t = mark_sharding(torch.zeros(4, 4).to(xla), theirs, ("z", "x"))
    u = torch.zeros(4, 4).to(xla)
    xs.mark_sharding(u, theirs, ("z", "x"))
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == torch_xla._XLAC._get_xla_sharding_spec(u)
    assert t.sharding.mesh == MESH
    set_global_mesh(theirs)
    assert get_global_mesh() == MESH
    set_global_mesh(None)
    with pytest.raises(
        TypeError,
        match=r"expects a mesh.Mesh \(or a torch_xla Mesh, or a torch.distributed DeviceMesh\), got builtins.dict",
    ):
        set_global_mesh({"device_ids": [0]})


def test_hybrid_mesh_keeps_torch_xla_methods():
    from mesh import DeviceInfo

    m = HybridMesh(ici_mesh_shape=(2, 2), axis_names=("a", "b"), devices=[DeviceInfo(i) for i in range(4)])
    assert m.get_axis_name_idx("b") == 1
    assert Mesh.from_str(str(m)) == Mesh(np.arange(4), (2, 2), ("a", "b"))
