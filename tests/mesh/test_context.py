import threading

import numpy as np
import pytest

from mesh import Mesh, get_1d_mesh, get_global_mesh, set_global_mesh, use_mesh


@pytest.fixture(autouse=True)
def _reset():
    set_global_mesh(None)
    yield
    set_global_mesh(None)


def test_set_and_get():
    assert get_global_mesh() is None
    m = Mesh(np.arange(8), (8,), ("x",))
    set_global_mesh(m)
    assert get_global_mesh() is m


def test_use_mesh_nests_and_restores():
    outer = Mesh(np.arange(8), (8,), ("x",))
    inner = Mesh(np.arange(8), (4, 2), ("x", "y"))
    set_global_mesh(outer)
    with use_mesh(inner):
        assert get_global_mesh() is inner
    assert get_global_mesh() is outer


def test_use_mesh_is_thread_local():
    m = Mesh(np.arange(8), (8,), ("x",))
    seen = []
    with use_mesh(m):
        t = threading.Thread(target=lambda: seen.append(get_global_mesh()))
        t.start()
        t.join()
    assert seen == [None]


def test_type_errors():
    with pytest.raises(TypeError, match="Mesh"):
        set_global_mesh((8,))
    with pytest.raises(TypeError, match="Mesh"):
        with use_mesh("x"):
            pass


def test_get_1d_mesh_explicit_count():
    m = get_1d_mesh("data", num_devices=4)
    assert m.shape() == {"data": 4}
    assert get_1d_mesh(num_devices=2).axis_names is None
    assert get_1d_mesh("x", np.int64(8)) == get_1d_mesh("x", 8)  # a numpy int is an int


def test_get_1d_mesh_needs_the_count_here_and_spmd_reads_the_runtime(xla):
    import spmd

    with pytest.raises(TypeError, match="mesh.get_1d_mesh needs num_devices.*spmd.get_1d_mesh"):
        get_1d_mesh("fsdp")
    assert spmd.get_1d_mesh("fsdp").mesh_shape == (8,)
    assert spmd.get_1d_mesh("fsdp") == get_1d_mesh("fsdp", 8)  # the same value
