"""A save SIGKILLed at any step of the commit is never taken as complete: LATEST keeps naming the
previous version, it loads, and the next save clears what the killed one left.

Each case saves version 1, then starts a second save in a child process that SIGKILLs itself at
one point: after a shard file, after the index, after the version directory is renamed into
place (before LATEST is touched), and while LATEST's replacement is written (before the rename
that commits). CPU tensors, one process: the same commit path the DTensor save's rank 0 takes.
"""

import json
import subprocess
import sys

import pytest
import torch

from fsdp_xla.checkpoint import checkpoint_version, load_sharded, save_sharded
from tests.torchrun import child_env

SCRIPT = """
import os, signal, sys
import torch
from fsdp_xla import checkpoint
from fsdp_xla.checkpoint import _files, _save

path, point = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
checkpoint.save_sharded(path, model, extra={"step": 1})
print(checkpoint.checkpoint_version(path).name, flush=True)

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def after(function):
    def run(*args, **kwargs):
        out = function(*args, **kwargs)
        die()
        return out
    return run

if point == "device-file":
    _save.write_device_file = after(_save.write_device_file)
elif point == "index":
    _save.write_index = after(_save.write_index)
elif point == "before-latest":
    _files.atomic_write = die
elif point == "latest-rename":
    real = os.replace
    os.replace = lambda src, dst: die() if str(dst).endswith("LATEST") else real(src, dst)
with torch.no_grad():
    model.weight.add_(1.0)
checkpoint.save_sharded(path, model, extra={"step": 2})
"""


@pytest.mark.parametrize("point", ["device-file", "index", "before-latest", "latest-rename"])
def test_a_save_killed_before_its_commit_leaves_the_previous_version(tmp_path, point):
    script = tmp_path / "save.py"
    script.write_text(SCRIPT)
    ckpt = tmp_path / "ckpt"
    run = subprocess.run(
        [sys.executable, str(script), str(ckpt), point], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert run.returncode == -9, run.stderr[-2000:]  # it died by SIGKILL, mid-save
    first = run.stdout.split()[0]
    assert checkpoint_version(ckpt).name == first
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.mul_(0)
    assert load_sharded(ckpt, model) == {"step": 1}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
    leftovers = sorted(p.name for p in ckpt.iterdir() if p.name not in (first, "LATEST", ".lock"))
    assert leftovers, "the killed save left nothing behind: it was not killed mid-save"
    save_sharded(ckpt, model, extra={"step": 3})  # the next save commits and clears what the killed one left
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([".lock", "LATEST", checkpoint_version(ckpt).name])
    assert json.loads((checkpoint_version(ckpt) / "index.json").read_text())["extra"] == {"step": 3}
