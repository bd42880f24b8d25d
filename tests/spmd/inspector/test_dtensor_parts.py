"""Parts of the DTensor lane's dry run that need no run: FSDP2's chunks made when read, the
report's warnings."""

import sys

import pytest
import torch

from spmd.inspector._dtensor_report import DryRunReport
from spmd.inspector._dtensor_run import RankRun
from spmd.inspector._dtensor_world import _Chunks

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12), reason="the DTensor lane (torch 2.15)")


@pytest.mark.parametrize(
    "shape,n,dim", [((10, 3), 4, 0), ((256, 4), 1024, 0), ((0, 3), 4, 0), ((7,), 7, 0), ((5, 8), 3, 1), ((1,), 2, 0)]
)
def test_chunks_are_fsdp2s_chunks(shape, n, dim):
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    t = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    theirs, ours = _chunk_with_empty(t, n, dim), _Chunks(t, n, dim)
    assert len(ours) == len(theirs) == n
    for i in (*range(min(n, 9)), n - 1, -1):
        assert ours[i].shape == theirs[i].shape and ours[i].stride() == theirs[i].stride(), i
        assert torch.equal(ours[i], theirs[i]), i
    with pytest.raises(IndexError):
        ours[n]


def test_ignore_leaves_out_a_warning_code():
    run = RankRun(0, 4, (), {"train.py:3": 2})
    (warning,) = DryRunReport("train.py", 4, (run,)).warnings()
    assert warning["code"] == "data-dependent-call" and warning["message"].startswith("train.py:3 read a tensor's")
    assert DryRunReport("train.py", 4, (run,), frozenset({"data-dependent-call"})).warnings() == []


def test_worst_starts_with_rank_0():
    import argparse

    from spmd.inspector._dtensor_cli import chosen_ranks

    def ranks(**flags):
        return chosen_ranks(argparse.Namespace(**{"world": 1024, "rank": None, "ranks": None, **flags}))

    assert ranks(ranks="worst") == [0] and ranks() == [0] and ranks(rank=7) == [7]
    assert ranks(ranks="all", world=3) == [0, 1, 2]
    with pytest.raises(SystemExit):
        ranks(rank=1024)


class _Mesh:
    """What `ShardShapes` reads of a DeviceMesh: its ranks and shape."""

    def __init__(self, ranks):
        self.mesh, self.shape = torch.tensor(ranks), tuple(torch.tensor(ranks).shape)


class _Layout:
    def __init__(self, shape, placements, mesh):
        self.shape, self.placements, self.device_mesh = torch.Size(shape), placements, mesh


def test_ranks_are_grouped_by_the_local_shapes_of_their_shards():
    from torch.distributed.tensor import Replicate, Shard

    from spmd.inspector._dtensor_shards import ShardShapes

    mesh = _Mesh([[3, 2], [1, 0]])  # rank 3 at (0, 0), rank 0 at (1, 1)
    shapes = ShardShapes()
    shapes._note(_Layout((4, 6), (Shard(0), Shard(1)), mesh))  # even: every rank (2, 3)
    assert shapes.groups(4) == ((0, 1, 2, 3),)
    shapes._note(_Layout((3, 6), (Shard(0), Replicate()), mesh))  # 2 rows at mesh row 0 (ranks 3, 2), 1 at row 1
    assert shapes.groups(4) == ((0, 1), (2, 3))
    shapes._note(_Layout((5,), (Replicate(), Shard(0)), mesh))  # 3 at mesh column 0 (ranks 3, 1), 2 at column 1
    assert shapes.groups(4) == ((0,), (1,), (2,), (3,))
    assert shapes.groups(6)[-1] == (4, 5)  # ranks outside the mesh hold none of it


def test_a_model_built_in_the_fake_world_moves_with_to():
    """``model.to(device)`` on fake parameters: torch 2.15 refuses the swap (the fake mode's memo
    holds a weak reference to each); in the dry run's world it swaps, and other weak references
    are still refused."""
    import weakref

    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from spmd.inspector._dtensor_world import fake_world

    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(RuntimeError, match="Couldn't swap"):
            torch.nn.Linear(4, 3).to("cpu")  # torch's own behaviour, outside the dry run's world
    with fake_world(2, 1), FakeTensorMode(allow_non_fake_inputs=True):
        model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 3))
        weight = model[1].weight
        model.to("cpu", dtype=torch.float64)
        assert model[1].weight is weight and isinstance(weight, FakeTensor) and weight.dtype == torch.float64
        held = torch.nn.Linear(2, 2)
        kept = weakref.ref(held.bias)
        with pytest.raises(RuntimeError, match="Couldn't swap Linear.bias"):
            held.double()
        assert kept() is held.bias


def test_a_device_meshs_ranks_read_back_real_in_the_fake_world():
    """A DeviceMesh's rank tensor (made anew at each read in torch 2.15) is topology: code that
    converts a mesh reads its real ids, and no placeholder is listed against the script."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import DeviceMesh

    from mesh import Mesh
    from spmd.inspector._dtensor_placeholders import Placeholders
    from spmd.inspector._dtensor_world import fake_world

    placeholders = Placeholders()
    with fake_world(4, 2), FakeTensorMode(allow_non_fake_inputs=True), placeholders:
        device_mesh = DeviceMesh("cpu", [[3, 2], [1, 0]], mesh_dim_names=("a", "b"))
        ours = Mesh.from_device_mesh(device_mesh)
        fake_value = torch.ones(2).sum().item()  # a fake tensor's value: a placeholder, listed
    assert ours.device_ids.tolist() == [3, 2, 1, 0] and dict(ours.shape()) == {"a": 2, "b": 2}
    assert fake_value == 0.0 and sum(placeholders.lines.values()) == 1


def test_cpu_0_is_cpu_in_the_fake_world():
    """A real CPU tensor drops the index (the Trainer moves batches to ``cpu:0``); the fake mode
    kept it and refused ``cpu`` and ``cpu:0`` in one op."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from spmd.inspector._dtensor.world import fake_world

    with fake_world(2, 0), FakeTensorMode(allow_non_fake_inputs=True):
        total = torch.zeros(2) + torch.zeros(2).to("cpu:0")
    assert total.device == torch.device("cpu")
