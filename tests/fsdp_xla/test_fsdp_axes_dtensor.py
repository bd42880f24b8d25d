"""FSDP over several mesh axes, and HSDP, on the dtensor backend (torch's fully_shard over a
flattened or 2-D DeviceMesh) under torchrun, gloo, 4 ranks (tests/workers/fsdp_axes_worker.py):
numerics against eager single-process training, each rank's stored share, the replicas' equality,
the collectives and their process groups, and checkpoints moved between layouts."""

import json

import pytest

from tests.torchrun import WORKERS, warm_launch


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_axes")
    run = warm_launch(WORKERS / "fsdp_axes_worker.py", 4, str(out))
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("layout", ["fsdp_context", "hsdp", "hsdp_flat"])
def test_training_equals_eager_single_process(results, layout):
    run = results[layout]
    assert run["losses"] == pytest.approx(results["eager_losses"], rel=1e-5)
    assert run["grad_rel_error"] <= 1e-5, run["grad_rel_error"]  # first step, before Adam amplifies rounding


def test_fsdp_times_context_is_one_flattened_shard_dim(results):
    run = results["fsdp_context"]
    assert run["shares"] == [0.25]  # every parameter: a quarter on each rank
    assert run["placements"] == ["Shard(dim=0)"] and run["mesh_dims"] == ["fsdp_context"]
    groups = {(r["phase"], r["kind"], tuple(map(tuple, r["groups"]))) for r in run["traffic"]}
    assert groups == {
        ("forward-gather", "all-gather", ((0, 1, 2, 3),)),
        ("backward-gather", "all-gather", ((0, 1, 2, 3),)),
        ("gradient-reduction", "reduce-scatter", ((0, 1, 2, 3),)),
        ("other", "all-reduce", ((0, 1, 2, 3),)),  # the loss the worker averages for its record
    }


@pytest.mark.parametrize("layout, shard_dim", [("hsdp", "fsdp"), ("hsdp_flat", "fsdp_context")])
def test_hsdp_stores_halves_and_the_replicas_agree(results, layout, shard_dim):
    run = results[layout]
    assert run["shares"] == [0.5]
    assert run["placements"] == ["Replicate()", "Shard(dim=0)"] and run["mesh_dims"] == ["data", shard_dim]
    assert run["replicas_identical"] is True


def test_hsdp_reduce_scatters_over_fsdp_and_all_reduces_over_data(results):
    """Rank 0's view: gathers and reduce-scatters in its fsdp group (0, 1), then each unit's
    shard all-reduced over its data group (0, 2), as FSDP2's HSDP does."""
    records = results["hsdp"]["traffic"]
    reductions = [(r["kind"], r["groups"]) for r in records if r["phase"] == "gradient-reduction"]
    assert reductions == [("reduce-scatter", [[0, 1]]), ("all-reduce", [[0, 2]])] * 3  # the root and 2 blocks
    gathers = {tuple(r["groups"][0]) for r in records if r["kind"] == "all-gather"}
    assert gathers == {(0, 1)}


def test_a_checkpoint_moves_between_layouts(results):
    """Saved by fsdp 4 after two steps, loaded into fsdp x context, HSDP and HSDP over a
    flattened dim; saved again by HSDP (one copy of each block: the replicas write nothing) and
    loaded into fsdp 4: every one continues with the uninterrupted losses."""
    ck = results["checkpoints"]
    for layout in ("fsdp_context", "hsdp", "hsdp_flat", "hsdp_to_fsdp4"):
        assert ck[layout] == pytest.approx(ck["uninterrupted"], rel=1e-5), layout
    assert ck["uninterrupted"] == pytest.approx(results["eager_losses"][2:], rel=1e-5)
    assert ck["hsdp_files"] == ["device-00000.safetensors", "device-00001.safetensors"]
