"""A torch_xla training script runs with only its imports switched to ours, with torch_xla's losses.

torch_xla 2.9 itself cannot run its docs' pattern ``x = xs.mark_sharding(x, ...)`` followed by
training (measured with this script: backward on a model fed its ``XLAShardedTensor`` wrapper
fails a functionalization assert, and FSDPv2 cannot shard the wrapper's outputs). Its losses are taken from the same script
with the return value unused (``xs.mark_sharding(x, ...)``, which shards ``x`` in place).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat.run_torch_xla_spmd_tests import ours
from tests.torchrun import TEST_XLA_FLAGS

SCRIPT = Path(__file__).with_name("torch_xla_style_script.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(source: str, tmp_path: Path, name: str) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(source)
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="8", PYTHONPATH=str(ROOT), XLA_FLAGS=TEST_XLA_FLAGS)
    return subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300)


def _losses(run: subprocess.CompletedProcess) -> dict:
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_import_rewrite_touches_only_imports():
    text = SCRIPT.read_text()
    rewritten = ours(text)
    changed = [(a, b) for a, b in zip(text.splitlines(), rewritten.splitlines()) if a != b]
    assert changed == [("import torch_xla.distributed.spmd as xs", "import spmd as xs")]
    assert ours("from torch_xla.distributed.spmd.xla_sharding import X") == "from spmd.xla_sharding import X"
    assert ours("import torch_xla.distributed.spmd_other") == "import torch_xla.distributed.spmd_other"


@pytest.mark.torch_xla
def test_same_losses_as_torch_xla(tmp_path):
    text = SCRIPT.read_text()
    assert text.count("    x = xs.mark_sharding(x, ") == 2
    mine = _losses(_run(ours(text), tmp_path, "ours.py"))
    assert mine["xs"] == "spmd"
    # torch_xla 2.9 cannot train with the returned wrapper (module docstring): its run shards in place.
    theirs = _losses(
        _run(text.replace("    x = xs.mark_sharding(x, ", "    xs.mark_sharding(x, "), tmp_path, "theirs.py")
    )
    assert theirs["xs"] == "torch_xla.distributed.spmd"
    for key in ("spmd", "fsdp"):
        assert len(mine[key]) == 4 and mine[key][-1] < mine[key][0]  # it trains
        assert mine[key] == pytest.approx(theirs[key], rel=1e-6), key
