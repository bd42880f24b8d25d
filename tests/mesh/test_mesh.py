import pickle
from collections import OrderedDict

import numpy as np
import pytest

from mesh import DeviceCountError, Mesh, MeshError, MeshTypeError


def test_blog_mesh_accessors():
    mesh = Mesh(np.array(range(8)), (4, 2), ("x", "y"))
    assert mesh.get_logical_mesh().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.shape() == OrderedDict([("x", 4), ("y", 2)])
    assert mesh.size() == 8
    assert mesh.axis_names == ("x", "y")
    assert mesh.mesh_shape == (4, 2)
    assert mesh.ndim == 2


def test_unnamed_mesh_uses_indices():
    mesh = Mesh(range(8), (2, 4))
    assert mesh.shape() == OrderedDict([(0, 2), (1, 4)])
    assert mesh.axis_index(1) == 1
    assert mesh.axis_label(1) == 1


@pytest.mark.smoke
def test_value_semantics():
    a = Mesh(np.arange(8), (4, 2), ("x", "y"))
    b = Mesh(list(range(8)), [4, 2], ["x", "y"])
    assert a == b and hash(a) == hash(b)
    assert a != Mesh(np.arange(8), (2, 4), ("x", "y"))
    assert a != Mesh(np.arange(8)[::-1], (4, 2), ("x", "y"))
    assert len({a, b}) == 1
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(AttributeError, match="immutable"):
        a.mesh_shape = (8,)
    with pytest.raises(ValueError):
        a.device_ids[0] = 5


def test_repr_is_readable():
    assert repr(Mesh(np.arange(8), (4, 2), ("x", "y"))) == (
        "Mesh(device_ids=range(8), mesh_shape=(4, 2), axis_names=('x', 'y'))"
    )
    assert "[1, 0]" in repr(Mesh([1, 0], (2,)))


def test_device_ids_may_be_a_grid():
    mesh = Mesh(np.arange(8).reshape(4, 2), (2, 4))
    assert mesh.get_logical_mesh().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_shape_product_mismatch():
    with pytest.raises(MeshError, match=r"mesh_shape \(4, 4\) holds 16 devices but 8 device ids"):
        Mesh(np.arange(8), (4, 4))


def test_duplicate_device_ids():
    with pytest.raises(MeshError, match=r"Device ids \[3\] appear more than once"):
        Mesh([0, 1, 2, 3, 3, 5, 6, 7], (8,))


def test_negative_ids_and_bad_sizes():
    with pytest.raises(MeshError, match="must be >= 0"):
        Mesh([-1, 0], (2,))
    with pytest.raises(MeshError, match=">= 1"):
        Mesh([], (0,))
    with pytest.raises(MeshError, match="at least one axis"):
        Mesh([0], ())


def test_axis_names_checked():
    with pytest.raises(MeshError, match="has 1 names but mesh_shape"):
        Mesh(np.arange(8), (4, 2), ("x",))
    with pytest.raises(MeshError, match="distinct"):
        Mesh(np.arange(8), (4, 2), ("x", "x"))
    with pytest.raises(MeshTypeError, match="strings"):
        Mesh(np.arange(8), (4, 2), ("x", 1))
    with pytest.raises(MeshTypeError, match="integers"):
        Mesh(np.arange(8), (4.0, 2))


def test_axis_lookup_errors_name_the_mesh():
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    with pytest.raises(MeshError, match=r"'tensor' is not in mesh\{'data': 4, 'model': 2\}"):
        mesh.axis_index("tensor")
    with pytest.raises(MeshError, match="out of range"):
        mesh.axis_index(2)
    with pytest.raises(
        MeshError, match=r"Mesh axis index 5 is out of range for mesh\{'data': 4, 'model': 2\}; use 0..1"
    ):
        mesh.axis_label(5)
    assert mesh.axis_label(1) == "model" and mesh.axis_label(np.int64(0)) == "data"


def test_device_count_checked_where_used():
    mesh = Mesh(np.arange(16), (4, 4), ("x", "y"))  # building needs no runtime
    with pytest.raises(DeviceCountError, match=r"uses device ids \[8, 9, .*only 8 device"):
        mesh.check_device_count(8)
    mesh.check_device_count(16)
    with pytest.raises(DeviceCountError, match=r"the mesh has 16 devices but the runtime has 32.*range\(32\)"):
        mesh.check_device_count(32)  # every device once: a smaller mesh is refused too
    mesh.check_device_count(np.int64(16))
    for bad in ("16", -1, 16.0, None):
        with pytest.raises(MeshTypeError, match=r"available must be the runtime's device count \(an int >= 0\)"):
            mesh.check_device_count(bad)


def test_from_str_reads_what_str_prints_and_nothing_else():
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    assert Mesh.from_str(str(mesh)) == mesh
    assert Mesh.from_str(str(Mesh(np.arange(8), (8,)))) == Mesh(np.arange(8), (8,))
    for text in ("-" * 100_000 + "1", "{" + "[" * 100_000 + "}", "{'device_ids': [-1]}", "not a mesh", ""):
        assert Mesh.from_str(text) is None  # the parser's memory and recursion are not reached
    with pytest.raises(MeshTypeError, match="Mesh.from_str reads the text str\\(mesh\\) prints, got NoneType"):
        Mesh.from_str(None)


def test_from_ranks_and_from_device_mesh_keep_order_shape_and_names():
    import torch

    # TorchTPU's topology_aware_mesh returns a permuted rank tensor shaped like the mesh.
    ranks = torch.tensor([[3, 1], [2, 0]])
    mesh = Mesh.from_ranks(ranks, ("data", "fsdp"))
    assert mesh == Mesh([3, 1, 2, 0], (2, 2), ("data", "fsdp"))

    class FakeDeviceMesh:  # what a torch.distributed DeviceMesh exposes
        mesh = torch.tensor([[0, 2], [1, 3]])
        mesh_dim_names = ("x", "y")

    assert Mesh.from_device_mesh(FakeDeviceMesh()) == Mesh([0, 2, 1, 3], (2, 2), ("x", "y"))
    with pytest.raises(MeshTypeError, match="takes a torch.distributed DeviceMesh, got list"):
        Mesh.from_device_mesh([0, 1])
    with pytest.raises(MeshTypeError, match="n-d array of device ids, got the scalar 3"):
        Mesh.from_ranks(3)
