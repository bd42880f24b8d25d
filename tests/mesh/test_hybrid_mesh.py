"""HybridMesh ordering, tested on mock topologies given by coordinates (no TPU needed)."""

import itertools

import numpy as np
import pytest

from mesh import DeviceInfo, HybridMesh, MeshError


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


def test_merged_axis_is_a_product_of_whole_physical_axes():
    devs = tpu_slice((2, 2, 4))
    m = HybridMesh(ici_mesh_shape=(4, 4), axis_names=("data", "model"), devices=devs)
    by_id = coords_of(devs)
    grid = m.get_logical_mesh()
    # 'data' spans x and y (the first permutation that fits), 'model' is the z line.
    for row in grid:
        zs = [by_id[int(d)].coords[2] for d in row]
        xy = {by_id[int(d)].coords[:2] for d in row}
        assert zs == [0, 1, 2, 3] and len(xy) == 1


def test_cores_on_chip_form_an_axis():
    devs = tpu_slice((2, 2, 1), cores=2)  # v3-8 style: 4 chips x 2 cores
    m = HybridMesh(ici_mesh_shape=(4, 2), axis_names=("data", "model"), devices=devs)
    by_id = coords_of(devs)
    for row in m.get_logical_mesh():
        chips = {by_id[int(d)].coords for d in row}
        assert len(chips) == 1  # the 2-wide 'model' axis is the two cores of one chip


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
    m = HybridMesh(ici_mesh_shape=(4, 2), axis_names=("data", "model"))
    assert m.device_ids.tolist() == list(range(8))
