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


def worker(action, ckpt, out, nproc=4):
    run = torchrun(WORKER, nproc, action, str(ckpt), str(out))
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(Path(out).read_text())


def test_torch_xla_checkpoint_continues_on_dtensor(xla, tmp_path):
    data = batches(4)
    model, opt = gspmd_model(0)
    train(model, data[:2], xla, fsdp_mesh(), optimizer=opt)
    ck.save_sharded(tmp_path / "ck", model, opt, extra={"steps": 2})
    gspmd_losses = train(model, data[2:], xla, fsdp_mesh(), optimizer=opt)
    dtensor = worker("load_continue", tmp_path / "ck", tmp_path / "out.json")
    assert dtensor["extra"] == {"steps": 2}
    assert dtensor["losses"] == pytest.approx(gspmd_losses, rel=1e-5)


def test_dtensor_checkpoint_continues_on_torch_xla_and_on_fewer_processes(xla, tmp_path):
    saved = worker("train_save", tmp_path / "ck", tmp_path / "saved.json")
    model, opt = gspmd_model(7)  # other weights, overwritten by the load
    assert ck.load_sharded(tmp_path / "ck", model, opt) == {"steps": 2}
    gspmd_losses = train(model, batches(4)[2:], xla, fsdp_mesh(), optimizer=opt)
    assert gspmd_losses == pytest.approx(saved["losses"], rel=1e-5)
    two = worker("load_continue", tmp_path / "ck", tmp_path / "two.json", nproc=2)
    assert two["losses"] == pytest.approx(saved["losses"], rel=1e-5)
