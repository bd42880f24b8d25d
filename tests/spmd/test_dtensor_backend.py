"""The dtensor backend: our Mesh / PartitionSpec / mark_sharding on torch.distributed DTensor.

The conformance runs launch torchrun (gloo, CPU) with 4 and 8 processes, the meshes of the GSPMD
conformance tests (1, 2 and 3 axes); the placement translation is checked here without processes.
"""

import json

import numpy as np
import pytest
import torch

import spmd
from mesh import Mesh
from spmd import PartitionSpec, ShardingError
from spmd._backend import backend_for, use_backend
from spmd._backend.dtensor_backend import placements_for, spec_of
from spmd._util import torch_compat
from tests.background import torchrun_in_background
from tests.conftest import HAS_TORCH_XLA
from tests.spmd.specs import all_specs
from tests.torchrun import WORKERS, warm_launch

WORKER = WORKERS / "dtensor_worker.py"


@pytest.mark.smoke
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
    # GSPMD cuts 10 into blocks of 3 (3, 3, 3, 1); DTensor into 5 + 5, then 3 + 2 each.
    with pytest.raises(ShardingError, match=r"dim 0 \(10\) is split over 2 mesh axes \(4 ways\).*Pad dim 0"):
        placements_for(mesh, PartitionSpec(("x", "y")), (10,))
    with pytest.raises(ShardingError, match=r"against mesh order.*only when the dim divides evenly \(4 ways\)"):
        placements_for(mesh, PartitionSpec(("y", "x")), (6,))


def test_uneven_and_empty_blocks_follow_gspmd_where_dtensor_cuts_the_same():
    mesh = Mesh(np.arange(4), (2, 2), ("x", "y"))
    # 7 over 4: GSPMD 2, 2, 2, 1; DTensor 4 -> 2 + 2 and 3 -> 2 + 1: the same blocks.
    assert [type(p).__name__ for p in placements_for(mesh, PartitionSpec(("x", "y")), (7,))] == ["Shard", "Shard"]
    # One row over 4 devices: three empty blocks, as on GSPMD.
    assert [str(p) for p in placements_for(mesh, PartitionSpec("x"), (1,))] == ["S(0)", "R"]
    # A size-1 axis splits nothing and is left out, so its position in the spec does not matter.
    wide = Mesh(np.arange(4), (1, 4), ("x", "y"))
    assert placements_for(wide, PartitionSpec(("y", "x")), (8,)) == placements_for(wide, PartitionSpec("y"), (8,))


def test_backend_rule():
    # No torch.distributed here: torch_xla's errors where it is installed, else how to start torchrun.
    assert backend_for(torch.zeros(2)).name == ("torch_xla" if HAS_TORCH_XLA else "dtensor")
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


@pytest.mark.parametrize("chosen", [None, "dtensor"])
@pytest.mark.parametrize("given", [[1.0, 2.0], np.zeros(2), torch.nn.Linear(2, 2), "x"])
def test_backend_for_refuses_what_is_not_a_tensor_naming_it(given, chosen):
    # the fallback backend used to come back, and its errors then blamed the device or torchrun
    use_backend(chosen)
    try:
        with pytest.raises(
            spmd.errors.SpmdTypeError,
            match=rf"backend_for takes a torch.Tensor or None, got {type(given).__name__} .*torch.as_tensor",
        ):
            spmd.backend_for(given)
        assert spmd.backend_for(torch.nn.Parameter(torch.zeros(2))).name in spmd.BACKENDS  # a parameter is a tensor
    finally:
        use_backend(None)


# 8 ranks on 2 cores take a minute. Where torch cannot order a group's ranks (2.9, the torch_xla
# lane) permuted meshes are refused and 8 ranks only add in-order layouts to the 4-rank run's,
# so there it runs on demand (pytest -m slow); the current lane runs it always.
_EIGHT_RANKS_MARKS = () if torch_compat.ordered_groups_supported() else (pytest.mark.slow,)


@pytest.mark.parametrize("ranks, least_cases", [(4, 340), pytest.param(8, 600, marks=_EIGHT_RANKS_MARKS)])
def test_every_rank_holds_the_block_our_math_says(tmp_path, ranks, least_cases):
    out = tmp_path / "result.json"
    run = warm_launch(WORKER, ranks, str(out))
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["world"] == ranks
    assert result["mismatches"] == []  # blocks, get_sharding, full_tensor and redistribute on every rank
    assert result["cases"] >= least_cases  # uneven and empty-block shapes included
    assert result["distribute_module_refused"]  # and left the module as it was (else a mismatch)
    refusals = result["refusals"]
    assert all(
        any(
            why in r
            for why in (
                "cut it differently",
                "divides evenly",
                "cannot be a DeviceMesh",
                "at most two axes",
                "splits again",
            )
        )
        for r in refusals
    ), refusals
    if result["ordered_groups"]:  # torch 2.15: permuted meshes laid out in mesh order, collectives included
        assert result["permuted_cases"] >= least_cases // 2
        assert not any("cannot be a DeviceMesh" in r for r in refusals)
        # Rank 0 sits last on the reversed mesh [n-1, ..., 0], so it holds the last element.
        assert result["reversed_mesh"] == {"local": [float(ranks - 1)], "full": [float(i) for i in range(ranks)]}
    else:  # torch 2.9: refused, saying why and what to do
        assert "order their ranks by id" in result["reversed_mesh_error"]
        assert "xla-spmd[current]" in result["reversed_mesh_error"]
    assert "has no parameters ['emb.wieght']" in result["shard_parameters_error"]
    larger = result["larger_mesh_error"]
    assert f"mark_sharding(tensor of shape (8,), spec P('x'), mesh{{'x': {2 * ranks}}})" in larger
    assert "torchrun --nproc_per_node n" in larger and "configure_default_devices" not in larger
    assert f"shape: rank 0 (8, 4), ranks 1-{ranks - 1} (6, 4)" in result["shape_mismatch_error"]


def test_replace_takes_a_bool_on_the_dtensor_backend_too():
    use_backend("dtensor")
    try:  # checked before the backend needs a process group
        with pytest.raises(TypeError, match="replace takes True or False, got 'no'"):
            spmd.mark_sharding(torch.zeros(4), Mesh(np.arange(4), (4,), ("x",)), PartitionSpec("x"), replace="no")
    finally:
        use_backend(None)


# Launches of the two scripts, each run in the background (tests/background.py): a launch is
# mostly torch's imports and the ranks' exits, waited for. Without the exit hook, 12 of 14
# launches of the second script aborted (with one collective in place of its four: 4 of 6), so 2
# launches catch it as surely as 3 did (98 % and 96 %).
EXITS = {
    "destroyed": tuple(torchrun_in_background(WORKERS / "exit_after_destroy_worker.py", 4, timeout=120) for _ in range(3)),
    "last-collective": tuple(
        torchrun_in_background(WORKERS / "exit_after_collective_worker.py", 4, timeout=120) for _ in range(2)
    ),
}  # fmt: skip


@pytest.mark.smoke
@pytest.mark.parametrize(
    "launches", [pytest.param(runs, marks=pytest.mark.reads(*runs), id=name) for name, runs in EXITS.items()]
)
def test_processes_exit_cleanly(launches):
    """torch 2.15 aborted exits ("terminate called without an active exception") two ways: the
    DeviceMesh a mesh caches kept a destroyed group's gloo workers alive into interpreter
    finalization, and a worker dropping the script's last collective waited for the GIL until
    finalization (without the exit hook, 1 of 6 launches of the first script aborted, 12 of 14 of
    the second). Every launch of 4 processes must exit 0."""
    for launch in launches:
        run = launch.completed()
        # What the aborting rank said comes before torchrun's long report: keep it in the message.
        said = [line for line in run.stderr.splitlines() if "terminate" in line or "what()" in line]
        assert run.returncode == 0 and "terminate called" not in run.stderr, "\n".join(said) + run.stderr[-1500:]
