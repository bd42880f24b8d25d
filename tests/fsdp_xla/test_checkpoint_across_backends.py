"""A checkpoint saved by one backend loads on the other and training continues with the same
losses: torch_xla (GSPMD, 8 devices) <-> dtensor (FSDP2, 4 processes under torchrun), and
dtensor 4 -> 2 processes. The migration path off torch_xla mid-run."""

import json
import shutil
from pathlib import Path

import pytest
import torch

import fsdp_xla.checkpoint as ck
from fsdp_xla import FSDP, transformer_auto_wrap_policy
from tests.fsdp_xla.helpers import GPT, SMALL, Block, batches, fsdp_mesh, train
from tests.torchrun import WORKERS, warm_launch

WORKER = WORKERS / "dtensor_checkpoint_worker.py"


def gspmd_model(seed):
    torch.manual_seed(seed)
    model = FSDP(GPT(**SMALL), mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def dtensor_jobs(nproc, *jobs):
    """One torchrun launch running ``jobs`` ((action, checkpoint, out.json), ...) in order."""
    run = warm_launch(WORKER, nproc, *(str(a) for job in jobs for a in job))
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(Path(out).read_text()) for _, _, out in jobs]


def test_checkpoints_cross_between_torch_xla_and_dtensor_and_to_fewer_processes(xla, tmp_path):
    data = batches(4)
    model, opt = gspmd_model(0)
    train(model, data[:2], xla, fsdp_mesh(), optimizer=opt)
    ck.save_sharded(tmp_path / "xla_ck", model, opt, extra={"steps": 2})
    gspmd_losses = train(model, data[2:], xla, fsdp_mesh(), optimizer=opt)

    from_xla, dtensor_saved = dtensor_jobs(
        4,
        ("load_continue", tmp_path / "xla_ck", tmp_path / "from_xla.json"),
        ("train_save", tmp_path / "dt_ck", tmp_path / "saved.json"),
    )
    # torch_xla -> dtensor: the loaded run continues with torch_xla's losses.
    assert from_xla["extra"] == {"steps": 2}
    assert from_xla["losses"] == pytest.approx(gspmd_losses, rel=1e-5)
    # The same training on dtensor from scratch: the same losses too.
    assert dtensor_saved["losses"] == pytest.approx(gspmd_losses, rel=1e-5)

    # dtensor -> torch_xla.
    model, opt = gspmd_model(7)  # other weights, overwritten by the load
    assert ck.load_sharded(tmp_path / "dt_ck", model, opt) == {"steps": 2}
    assert train(model, data[2:], xla, fsdp_mesh(), optimizer=opt) == pytest.approx(dtensor_saved["losses"], rel=1e-5)

    # dtensor 4 -> 2 processes.
    (on_two,) = dtensor_jobs(2, ("load_continue", tmp_path / "dt_ck", tmp_path / "two.json"))
    assert on_two["extra"] == {"steps": 2}
    assert on_two["losses"] == pytest.approx(dtensor_saved["losses"], rel=1e-5)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One torchrun launch of 2 ranks: a save, a load refused on one rank, and 3 saves (keep=1)
    into a directory holding another run's checkpoint (written here, by this process)."""
    tmp = tmp_path_factory.mktemp("two_ranks")
    ck.save_sharded(tmp / "theirs", torch.nn.Linear(3, 2), extra={"who": "them"})
    shutil.copytree(tmp / "theirs", tmp / "their_latest")  # with the LATEST a run resumes from
    (tmp / "theirs" / "LATEST").unlink()  # handed over: its version stays, nothing resumes from it
    before = files(tmp / "theirs")
    latest_before = {
        str(f.relative_to(tmp / "their_latest")): f.read_bytes()
        for f in (tmp / "their_latest").rglob("*")
        if f.is_file()
    }
    _, refused, pruned, kept_out = dtensor_jobs(
        2,
        ("train_save", tmp / "ck", tmp / "saved.json"),
        ("refuse_on_one_rank", tmp / "ck", tmp / "refused.json"),
        ("save_thrice", tmp / "theirs", tmp / "pruned.json"),
        ("save_thrice", tmp / "their_latest", tmp / "kept_out.json"),
    )
    return tmp, refused, pruned, before, kept_out, latest_before


def files(root):
    """Every file of ``root``'s versions, by relative path, with its bytes."""
    return {str(f.relative_to(root)): f.read_bytes() for f in root.glob("v-*/*") if f.is_file()}


def test_a_load_one_rank_refuses_is_refused_by_every_rank(two_ranks):
    """Rank 0 reads a damaged copy (a node-local disk), rank 1 a good one: both refuse, neither changes."""
    _, refused, *_ = two_ranks
    first, second = refused["ranks"]
    assert "checksum" in first["verdict"], first
    assert second["verdict"].startswith("CheckpointError: Rank 0 refused the load") and "checksum" in second["verdict"]
    assert first["unchanged"] and second["unchanged"]


def test_dtensor_saves_prune_only_their_own_lineage(two_ranks):
    """The ranks' saves (rank 0 prunes) keep 1 of their own and every byte of the other run's version."""
    tmp, _, pruned, before, *_ = two_ranks
    theirs = {name.split("/")[0] for name in before}
    assert files(tmp / "theirs").keys() >= before.keys()
    assert {k: v for k, v in files(tmp / "theirs").items() if k in before} == before
    assert sorted(p.name for p in (tmp / "theirs").glob("v-*")) == sorted([*theirs, pruned["written"][-1]])
    assert ck.checkpoint_version(tmp / "theirs").name == pruned["written"][-1]


def test_dtensor_saves_never_re_point_another_runs_latest(two_ranks):
    """Where LATEST names another run's version, every rank refuses the save and every byte stays."""
    tmp, *_, kept_out, latest_before = two_ranks
    assert [
        r.startswith("CheckpointError: ") and "holds another run's checkpoint" in r for r in kept_out["refused"]
    ] == [True, True]
    after = {
        str(f.relative_to(tmp / "their_latest")): f.read_bytes()
        for f in (tmp / "their_latest").rglob("*")
        if f.is_file()
    }
    assert {k: v for k, v in after.items() if k != ".lock"} == {k: v for k, v in latest_before.items() if k != ".lock"}
