"""An FSDP checkpoint moves between lanes: the torch_xla lane's (GSPMD, torch 2.9, 8 devices)
resumes on the current lane (DTensor, torch 2.15, 4 processes), and the current lane's resumes on
the torch_xla lane, each with the losses the uninterrupted run on the saving lane gave.

Each lane runs the test that loads the other lane's checkpoint (tests/data/cross_lane/, made by
``python -m tests.fsdp_xla.cross_lane save`` on that lane; see tests/fsdp_xla/cross_lane.py).
"""

import json
import shutil
import subprocess
import sys

import pytest

from tests.fsdp_xla.cross_lane import DATA, lane
from tests.torchrun import ROOT, child_env, warm_launch


def resume_here(saved_on: str, tmp_path) -> tuple[dict, dict]:
    """Resume ``saved_on``'s checkpoint on this lane: (what the run gave, what the saving lane recorded)."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(DATA / saved_on / "checkpoint", checkpoint)  # a load takes the directory's lock
    out = tmp_path / "resumed.json"
    args = ["resume", str(checkpoint), str(out)]
    if lane() == "torch_xla":
        command = [sys.executable, "-m", "tests.fsdp_xla.cross_lane", *args]
        run = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    else:
        run = warm_launch(ROOT / "tests" / "fsdp_xla" / "cross_lane.py", 4, *args, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text()), json.loads((DATA / saved_on / "expected.json").read_text())


def test_the_other_lanes_checkpoint_resumes_with_its_losses(tmp_path):
    other = "current" if lane() == "torch_xla" else "torch_xla"
    resumed, expected = resume_here(other, tmp_path)
    assert ("torch_xla" in expected["saved_by"]) == (other == "torch_xla")  # made where it says
    assert resumed["processes"] == (8 if lane() == "torch_xla" else 4)
    assert resumed["extra"] == {"steps": 2}
    assert resumed["losses"] == pytest.approx(expected["losses_after_resume"], rel=1e-5)


def test_both_lanes_recorded_the_same_uninterrupted_run():
    """The same 4 steps from the same weights on GSPMD (8 devices) and FSDP2 (4 processes)."""
    xla, current = (json.loads((DATA / name / "expected.json").read_text()) for name in ("torch_xla", "current"))
    assert xla["saved_by"]["torch"].startswith("2.9") and not current["saved_by"]["torch"].startswith("2.9")
    assert xla["losses_after_resume"] == pytest.approx(current["losses_after_resume"], rel=1e-5)
