"""HybridMesh ordering, tested on mock topologies given by coordinates (no TPU needed)."""

import itertools

import numpy as np
import pytest

from mesh import DeviceInfo, HybridMesh, MeshError, MeshTypeError, hybrid_device_order


def tpu_slice(dims, start_id=0, slice_index=0, cores=1, shuffle_seed=None):
    """Devices of one slice on a (x, y, z) chip grid, ids assigned in z, y, x, core order."""
    devs = []
    i = start_id
    for z, y, x, c in itertools.product(range(dims[2]), range(dims[1]), range(dims[0]), range(cores)):
        devs.append(DeviceInfo(i, coords=(x, y, z), core_on_chip=c, slice_index=slice_index))
        i += 1
    if shuffle_seed is not None:
        np.random.default_rng(shuffle_seed).shuffle(devs)
    return devs


def coords_of(devs):
    return {d.id: d for d in devs}


def test_logical_axes_follow_physical_axes():
    devs = tpu_slice((2, 2, 4), shuffle_seed=0)  # v4-32: 16 chips
    m = HybridMesh(ici_mesh_shape=(2, 2, 4), axis_names=("x", "y", "z"), devices=devs)
    by_id = coords_of(devs)
    grid = m.get_logical_mesh()
    for idx in np.ndindex(*grid.shape):
        assert by_id[int(grid[idx])].coords == idx


def _factorizations(n, parts):
    if parts == 1:
        yield (n,)
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in _factorizations(n // d, parts - 1):
                yield (d, *rest)


@pytest.mark.parametrize("phys", [(2, 2, 1), (2, 2, 2), (2, 2, 4), (4, 4, 1), (4, 4, 4), (8, 8, 1), (4, 8, 1)])
def test_ici_order_equals_jax_create_device_mesh(phys):
    """Wherever JAX's TPU mesh rule assigns whole physical axes, ours gives the same mesh."""
    from jax._src.mesh_utils import _create_device_mesh_for_nd_torus

    devs = tpu_slice(phys, shuffle_seed=1)
    grid = np.full(phys, -1)
    for d in devs:
        grid[d.coords] = d.id
    n = int(np.prod(phys))
    compared = 0
    for parts in (1, 2, 3):
        for logical in _factorizations(n, parts):
            ours = HybridMesh(ici_mesh_shape=logical, devices=devs).get_logical_mesh()
            try:
                theirs, _ = _create_device_mesh_for_nd_torus(grid, logical)
            except NotImplementedError:  # JAX splits no physical axis; we fall back to row-major
                assert sorted(ours.reshape(-1).tolist()) == list(range(n))
                continue
            assert ours.tolist() == theirs.tolist(), logical
            compared += 1
    assert compared >= 3


def test_torch_xla_two_slice_example():
    """torch_xla's own HybridMesh test: 2 slices of v4-8, names out of list order."""
    coords = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)] * 2
    names = [2, 1, 0, 3, 4, 7, 6, 5]
    attrs = [
        {"coords": list(c), "core_on_chip": 0, "slice_index": i // 4, "name": f"TPU:{n}"}
        for i, (c, n) in enumerate(zip(coords, names))
    ]
    devs = [DeviceInfo.from_attributes(i, a) for i, a in enumerate(attrs)]
    m = HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1), devices=devs)
    assert m.get_logical_mesh().tolist() == [[2, 1], [0, 3], [4, 7], [6, 5]]


def test_no_whole_axis_fit_splits_in_row_major_order():
    devs = tpu_slice((4, 2, 1))
    m = HybridMesh(ici_mesh_shape=(8,), devices=devs)
    assert sorted(m.device_ids.tolist()) == list(range(8))


def test_two_slices_dcn_is_the_major_part():
    devs = tpu_slice((2, 2, 1), 0, slice_index=0) + tpu_slice((2, 2, 1), 4, slice_index=1)
    m = HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("data", "fsdp"), devices=devs)
    assert m.shape() == {"data": 2, "fsdp": 4}
    by_id = coords_of(devs)
    grid = m.get_logical_mesh()
    assert {by_id[int(d)].slice_index for d in grid[0]} == {0}
    assert {by_id[int(d)].slice_index for d in grid[1]} == {1}
    assert m.ici_mesh_shape == (1, 4) and m.dcn_mesh_shape == (2, 1)


def test_dcn_on_inner_axis():
    devs = [DeviceInfo(i, slice_index=i // 4) for i in range(8)]
    m = HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(1, 2), axis_names=("a", "b"), devices=devs)
    # axis 'b' = dcn(2) x ici(2): slice 0's columns first, then slice 1's.
    assert m.get_logical_mesh().tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_devices_without_coords_are_ordered_by_id():
    devs = [DeviceInfo(i) for i in (3, 1, 0, 2)]
    assert HybridMesh(ici_mesh_shape=(2, 2), devices=devs).device_ids.tolist() == [0, 1, 2, 3]


def test_errors():
    devs = [DeviceInfo(i, slice_index=i // 4) for i in range(8)]
    with pytest.raises(MeshError, match=r"dcn_mesh_shape \(4, 1\) asks for 4 slices but the devices come from 2"):
        HybridMesh(ici_mesh_shape=(1, 2), dcn_mesh_shape=(4, 1), devices=devs)
    with pytest.raises(MeshError, match="same number of axes"):
        HybridMesh(ici_mesh_shape=(4,), dcn_mesh_shape=(2, 1), devices=devs)
    with pytest.raises(MeshError, match=r"ici_mesh_shape \(2, 4\) holds 8 devices but a slice has 4"):
        HybridMesh(ici_mesh_shape=(2, 4), dcn_mesh_shape=(2, 1), devices=devs)
    holes = [DeviceInfo(0, coords=(0, 0, 0)), DeviceInfo(1, coords=(2, 0, 0))]
    with pytest.raises(MeshError, match="bounding box"):
        HybridMesh(ici_mesh_shape=(2,), devices=holes)


def test_runtime_devices_on_cpu(xla):
    import spmd

    with pytest.raises(TypeError, match="mesh.HybridMesh needs devices=.*spmd.HybridMesh"):
        HybridMesh(ici_mesh_shape=(4, 2), axis_names=("data", "model"))
    m = spmd.HybridMesh(ici_mesh_shape=(4, 2), axis_names=("data", "model"))
    assert isinstance(m, HybridMesh) and m.get_op_sharding(("data",)) is not None
    assert m.device_ids.tolist() == list(range(8))


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: DeviceInfo("a"), MeshTypeError, r"DeviceInfo.id must be an int, got 'a' \(str\)"),
        (lambda: DeviceInfo(-1), MeshError, r"DeviceInfo.id must be >= 0, got -1"),
        (lambda: DeviceInfo(0, coords=("x", 0, 0)), MeshTypeError, r"DeviceInfo.coords must be an int, got 'x'"),
        (lambda: DeviceInfo(0, coords="ab"), MeshTypeError, r"coords must be a tuple of ints \(x, y, z\) or None"),
        (lambda: DeviceInfo(0, slice_index=1.5), MeshTypeError, r"DeviceInfo.slice_index must be an int, got 1.5"),
        (lambda: DeviceInfo.from_attributes(0, None), MeshTypeError, r"attributes must be a dict.*got NoneType"),
        (
            lambda: DeviceInfo.from_attributes(0, {"coords": "ab"}),
            MeshTypeError,
            r"device attributes \{'coords': 'ab'\}: DeviceInfo.coords must be a tuple of ints",
        ),
        (
            lambda: hybrid_device_order([DeviceInfo(i) for i in range(4)], (-2, -2), (1, 1)),
            MeshError,
            r"Every size in ici_mesh_shape must be >= 1, got \(-2, -2\)",
        ),
        (
            lambda: hybrid_device_order([DeviceInfo(i) for i in range(4)], "ab", "cd"),
            MeshTypeError,
            r"ici_mesh_shape must be a tuple of ints such as \(4, 2\), got 'ab'",
        ),
        (
            lambda: hybrid_device_order([0, 1], (2,), (1,)),
            MeshTypeError,
            r"devices must be a list of mesh.DeviceInfo, got \[0, 1\]",
        ),
    ],
)
def test_device_descriptions_and_shapes_are_checked(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_device_info_takes_numpy_ints():
    info = DeviceInfo(np.int64(3), coords=np.array([1, 0, 0]), slice_index=np.int32(1))
    assert info == DeviceInfo(3, coords=(1, 0, 0), slice_index=1) and type(info.id) is int
    assert hybrid_device_order([DeviceInfo(i) for i in range(4)], (np.int64(2), 2), (1, 1)).shape == (2, 2)
