"""The pure per-process layout (spmd.multiprocess): any number of processes, simulated in one.

The round trip: cut a global array into each process's local data (its rows along every dim
split over processes, from `ProcessLayout.rows`), then each device's block taken from its
process's local data (`ProcessLayout.blocks`) must equal the device's block of the global array.
"""

import itertools

import numpy as np
import pytest

from mesh import Mesh
from spmd import IndivisibleBatchError, P, ProcessDataError, hlo_sharding_for
from spmd.multiprocess._process_layout import ProcessLayout


def layouts(mesh, spec, rank, device_processes):
    hlo = hlo_sharding_for(mesh, spec, rank)
    return [ProcessLayout(hlo, rank, tuple(device_processes), p, "test") for p in sorted(set(device_processes))]


def local_data(layout, full):
    """This process's local data: its rows along each dim split over processes, else the whole dim."""
    index = [layout.rows(d, n) for d, n in enumerate(full.shape)]
    return full[np.ix_(*index)]


def check_round_trip(mesh, spec, shape, device_processes):
    full = np.arange(int(np.prod(shape))).reshape(shape)
    for layout in layouts(mesh, spec, len(shape), device_processes):
        local = local_data(layout, full)
        assert layout.global_shape(local.shape) == tuple(shape)
        for device, (slices, bounds) in layout.blocks(tuple(shape), local.shape).items():
            assert device_processes[device] == layout.process
            np.testing.assert_array_equal(local[slices], full[bounds.index], err_msg=f"device {device}")


def test_four_hosts_of_two_devices_split_the_batch():
    mesh = Mesh(np.arange(8), (8,), ("data",))
    processes = (0, 0, 1, 1, 2, 2, 3, 3)
    host1 = layouts(mesh, P("data"), 2, processes)[1]
    assert host1.rows(0, 16) == [4, 5, 6, 7]
    assert host1.global_shape((4, 3)) == (16, 3)
    blocks = host1.blocks((16, 3), (4, 3))
    assert {d: s[0] for d, (s, _) in blocks.items()} == {2: slice(0, 2), 3: slice(2, 4)}
    assert [b.index[0] for _, b in blocks.values()] == [slice(4, 6), slice(6, 8)]


@pytest.mark.parametrize(
    "mesh_shape, names, spec, processes",
    [
        ((8,), ("data",), P("data"), lambda d: d // 2),  # 4 hosts x 2 chips
        ((4, 2), ("data", "model"), P("data", "model"), lambda d: d // 2),  # a host is one 'data' row
        ((4, 2), ("data", "model"), P("data"), lambda d: d // 4),  # 2 hosts, batch over 'data'
        ((2, 4), ("data", "model"), P(("data", "model")), lambda d: d // 2),
        ((2, 4), ("data", "model"), P("model", "data"), lambda d: d // 4),  # hosts split dim 1
        ((2, 2, 2), ("a", "b", "c"), P(("a", "c"), "b"), lambda d: d // 2),
        ((8,), ("data",), P("data"), lambda d: d),  # DTensor: one process per device
        ((8,), ("data",), P(), lambda d: d // 2),  # replicated: every process holds everything
        ((8,), ("data",), P("data"), lambda d: 0),  # one process (torch_xla on this machine)
    ],
)
def test_each_device_gets_its_block_from_its_process(mesh_shape, names, spec, processes):
    mesh = Mesh(np.arange(8), mesh_shape, names)
    check_round_trip(mesh, spec, (16, 8), [processes(d) for d in range(8)])


def test_permuted_device_ids_and_interleaved_hosts():
    """A host holding tiles 0 and 2 of the batch dim loads those rows, in tile order."""
    rng = np.random.default_rng(0)
    for ids, processes in itertools.product(
        [np.arange(8), np.arange(8)[::-1], rng.permutation(8)], [[d % 4 for d in range(8)], [d // 2 for d in range(8)]]
    ):
        mesh = Mesh(ids, (8,), ("data",))
        check_round_trip(mesh, P("data"), (16, 2), processes)
    mesh = Mesh(np.arange(8), (8,), ("data",))
    host0 = layouts(mesh, P("data"), 1, [d % 4 for d in range(8)])[0]
    assert host0.rows(0, 8) == [0, 4]  # devices 0 and 4: tiles 0 and 4


def test_global_shape_given_as_the_whole_dim_is_read_from_every_process():
    mesh = Mesh(np.arange(8), (8,), ("data",))
    full = np.arange(40).reshape(10, 4)  # 10 rows over 8 devices: uneven, so every host passes all of them
    for layout in layouts(mesh, P("data"), 2, [d // 2 for d in range(8)]):
        for _, (slices, bounds) in layout.blocks((10, 4), (10, 4)).items():
            np.testing.assert_array_equal(full[slices], full[bounds.index])
        assert layout.global_shape((10, 4), (10, 4)) == (10, 4)


def test_a_batch_that_does_not_split_over_a_host_s_devices_is_refused():
    mesh = Mesh(np.arange(8), (8,), ("data",))
    host1 = layouts(mesh, P("data"), 2, [d // 2 for d in range(8)])[1]
    with pytest.raises(IndivisibleBatchError, match=r"test: process 1 of 4: dim 0 holds 3 local entries, 12 over"):
        host1.global_shape((3, 5))
    with pytest.raises(
        IndivisibleBatchError, match=r"12 entries along dim 0 \(the batch, for dim 0\) do not split into 8 equal blocks"
    ):
        host1.rows(0, 12)


def test_a_global_shape_that_fits_neither_way_is_refused():
    mesh = Mesh(np.arange(8), (8,), ("data",))
    host = layouts(mesh, P("data"), 2, [d // 2 for d in range(8)])[0]
    with pytest.raises(ProcessDataError, match=r"dim 0 of global_shape \(12, 3\) is 12.*give 16 .* or 4"):
        host.global_shape((4, 3), (12, 3))
    with pytest.raises(ProcessDataError, match=r"global_shape \(16,\) has 1 dims"):
        host.global_shape((4, 3), (16,))


def test_processes_holding_unequal_parts_have_no_layout():
    mesh = Mesh(np.arange(8), (8,), ("data",))
    uneven = [0, 0, 0, 1, 1, 1, 1, 1]  # 3 devices and 5 devices
    layout = layouts(mesh, P("data"), 1, uneven)[0]
    with pytest.raises(ProcessDataError, match=r"process 0 of 2: the processes hold tiles \{0: \[0, 1, 2\], 1: \[3,"):
        layout.global_shape((6,))
    assert layout.global_shape((8,), (8,)) == (8,)  # the whole dim from every process still works
