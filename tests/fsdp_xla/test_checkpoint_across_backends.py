"""A checkpoint saved by one backend loads on the other and training continues with the same
losses: torch_xla (GSPMD, 8 devices) <-> dtensor (FSDP2, 4 processes under torchrun), and
dtensor 4 -> 2 processes. The migration path off torch_xla mid-run."""

import json
from pathlib import Path

import pytest
import torch

import fsdp_xla.checkpoint as ck
from fsdp_xla import FSDP, transformer_auto_wrap_policy
from tests.fsdp_xla.helpers import GPT, SMALL, Block, batches, fsdp_mesh, train
from tests.torchrun import torchrun

WORKER = Path(__file__).with_name("dtensor_checkpoint_worker.py")


def gspmd_model(seed):
    torch.manual_seed(seed)
    model = FSDP(GPT(**SMALL), mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def dtensor_jobs(nproc, *jobs):
    """One torchrun launch running ``jobs`` ((action, checkpoint, out.json), ...) in order."""
    run = torchrun(WORKER, nproc, *(str(a) for job in jobs for a in job))
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


def test_a_load_one_rank_refuses_is_refused_by_every_rank(tmp_path):
    """Rank 0 reads a damaged copy (a node-local disk), rank 1 a good one: both refuse, neither changes."""
    _, refused = dtensor_jobs(
        2,
        ("train_save", tmp_path / "ck", tmp_path / "saved.json"),
        ("refuse_on_one_rank", tmp_path / "ck", tmp_path / "refused.json"),
    )
    first, second = refused["ranks"]
    assert "checksum" in first["verdict"], first
    assert second["verdict"].startswith("CheckpointError: Rank 0 refused the load") and "checksum" in second["verdict"]
    assert first["unchanged"] and second["unchanged"]
