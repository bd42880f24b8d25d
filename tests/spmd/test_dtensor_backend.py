"""The dtensor backend: our Mesh / PartitionSpec / mark_sharding on torch.distributed DTensor.

The conformance runs launch torchrun (gloo, CPU) with 4 and 8 processes, the meshes of the GSPMD
conformance tests (1, 2 and 3 axes); the placement translation is checked here without processes.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import spmd
from mesh import Mesh
from spmd import PartitionSpec, ShardingError
from spmd._backend import backend_for, use_backend
from spmd._backend.dtensor_backend import placements_for, spec_of
from tests.spmd.specs import all_specs
from tests.torchrun import torchrun

WORKER = Path(__file__).with_name("dtensor_worker.py")


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2), (2, 4), (2, 2, 2)])
def test_placements_round_trip_to_the_spec(mesh_shape):
    mesh = Mesh(np.arange(int(np.prod(mesh_shape))), mesh_shape, tuple("xyz"[: len(mesh_shape)]))
    checked = 0
    for rank in (1, 2, 3):
        shape = (16,) * rank  # divides every split, so nothing is refused
        for spec in all_specs(len(mesh_shape), rank):
            p = PartitionSpec(*spec)
            try:
                placements = placements_for(mesh, p, shape)
            except ShardingError as e:
                assert "out of mesh order" in str(e)  # three axes against mesh order
                continue
            assert spec_of(mesh, placements, rank) == p
            checked += 1
    assert checked >= 9


def test_layouts_dtensor_cannot_give_as_gspmd_are_refused():
    mesh = Mesh(np.arange(4), (2, 2), ("x", "y"))
    with pytest.raises(ShardingError, match=r"dim 0 \(10\) is split over 2 mesh axes \(4 ways\).*pad dim 0"):
        placements_for(mesh, PartitionSpec(("x", "y")), (10,))
    with pytest.raises(ShardingError, match="leaves some devices an empty block"):
        placements_for(mesh, PartitionSpec("x"), (1,))


def test_backend_rule():
    assert backend_for(torch.zeros(2)).name == "torch_xla"  # no torch.distributed here: torch_xla's errors
    use_backend("dtensor")
    try:
        assert backend_for(torch.zeros(2)).name == "dtensor"
    finally:
        use_backend(None)
    use_backend("dtensor")
    try:  # chosen, but no process group: the error says how to start one, not how to use XLA
        with pytest.raises(TypeError, match=r"spec P\('x'\).*: the dtensor backend needs torch.distributed: launch"):
            spmd.mark_sharding(torch.zeros(4), Mesh(np.arange(4), (4,), ("x",)), PartitionSpec("x"))
    finally:
        use_backend(None)
    with pytest.raises(ShardingError, match=r"Unknown backend 'jax'"):
        use_backend("jax")
    assert spmd.BACKENDS == ("torch_xla", "dtensor")


@pytest.mark.parametrize("ranks, least_cases", [(4, 132), (8, 520)])
def test_every_rank_holds_the_block_our_math_says(tmp_path, ranks, least_cases):
    out = tmp_path / "result.json"
    run = torchrun(WORKER, ranks, str(out))
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["world"] == ranks
    assert result["mismatches"] == []
    assert result["cases"] >= least_cases  # blocks checked on every rank, uneven shapes included
    assert "cannot be a DeviceMesh" in result["reversed_mesh_error"]
    assert "has no parameters ['emb.wieght']" in result["shard_parameters_error"]
    larger = result["larger_mesh_error"]
    assert f"mark_sharding(tensor of shape (8,), spec P('x'), mesh{{'x': {2 * ranks}}})" in larger
    assert "torchrun --nproc_per_node n" in larger and "configure_default_devices" not in larger
