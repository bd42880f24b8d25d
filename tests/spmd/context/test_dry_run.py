"""Context parallelism in the dry run (`python -m spmd.inspector --world N`, the current lane):
at 32K tokens and the same global batch and rows per rank, CP 4 (16 ranks) holds at most 0.3x the
per-rank peak of CP 1 (4 ranks), and each attention gathers its keys and values over the context
axis once in forward and reduce-scatters their gradients once in backward, with the bytes the
strategy's formula gives."""

import json
import subprocess
import sys

import pytest

from spmd._util import torch_compat
from tests.torchrun import ROOT, child_env

pytestmark = pytest.mark.skipif(
    torch_compat.TORCH_VERSION < (2, 15), reason="the dry run (--world) needs torch 2.15's fake process group"
)

SEQ, KV_HEADS, HEAD_DIM, LAYERS = 32768, 2, 32, 2
MODEL = ["--layers", str(LAYERS), "--d-model", "128", "--heads", "4", "--kv-heads", str(KV_HEADS), "--batch", "4"]


def dry_run(tmp_path, world, context):
    report = tmp_path / f"cp{context}.json"
    command = [sys.executable, "-m", "spmd.inspector", "--world", str(world), "--steps", "1", "--json", str(report)]
    command += [str(ROOT / "examples" / "train_long_context.py"), "--backend", "dtensor", "--steps", "1"]
    command += ["--seq", str(SEQ), "--context", str(context), *MODEL]
    run = subprocess.run(command, env=child_env(xla=False), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(report.read_text())["ranks"][0]["steps"][0]


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cp_dry_run")
    return dry_run(tmp, 4, 1), dry_run(tmp, 16, 4)


def test_cp_4_holds_at_most_0_3x_the_peak_of_cp_1(steps):
    without, with_cp = steps
    assert with_cp["peak_bytes"] <= 0.3 * without["peak_bytes"], (with_cp["peak_bytes"], without["peak_bytes"])


def test_each_attention_gathers_keys_and_values_once_with_the_formula_s_bytes(steps):
    _, with_cp = steps
    attention = [c for c in with_cp["collectives"] if c["module"].endswith(".attn")]
    gathered = 1 * KV_HEADS * SEQ * HEAD_DIM * 4  # one row a rank (4 rows over fsdp 4), float32, the whole sequence
    forward = [c for c in attention if c["phase"] == "forward"]
    backward = [c for c in attention if c["phase"] == "backward"]
    assert [c["op"] for c in forward] == ["all-gather"] * 2 * LAYERS  # K and V of each layer
    assert [c["op"] for c in backward] == ["reduce-scatter"] * 2 * LAYERS  # their gradients
    for c in forward:
        assert (c["bytes_in"], c["bytes_out"]) == (gathered // 4, gathered)
        assert c["bytes_sent"] == gathered * 3 // 4  # (context - 1) / context of it, over a ring
    for c in backward:
        assert (c["bytes_in"], c["bytes_out"]) == (gathered, gathered // 4)
    assert all(len(c["ranks"]) == 4 for c in attention)  # the context group: 4 ranks of the 16
