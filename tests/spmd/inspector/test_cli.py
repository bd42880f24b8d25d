"""``python -m spmd.inspector`` on examples/train_spmd.py: the table, the JSON, and the hand
calculation of docs/inspector.md."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.torchrun import ROOT, child_env

pytestmark = pytest.mark.torch_xla  # the inspector reads XLA's dumps of torch_xla's programs


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("inspector")
    json_path = out_dir / "report.json"
    env = child_env()
    run = subprocess.run(
        [sys.executable, "-m", "spmd.inspector", "--steps", "2", "--json", str(json_path), "examples/train_spmd.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout, json.loads(json_path.read_text()), json_path


def test_table_is_printed(cli_run):
    stdout, _, _ = cli_run
    assert "spmd.inspector: 2 compiled graph(s) on 8 CPU devices" in stdout
    assert "per-device peak" in stdout
    assert "step 0: 1 graph(s)" in stdout and "step 1: 1 graph(s)" in stdout
    assert "blocks.0.attn_out: aten__mm" in stdout


def test_json_and_hlo_are_written(cli_run):
    _, report, json_path = cli_run
    assert report["devices"] == 8 and report["platform"] == "CPU"
    assert [s["step"] for s in report["steps"]] == [0, 1]
    for graph in report["graphs"]:
        assert Path(graph["hlo_file"]).parent == json_path.with_name("report.hlo")
        assert "num_partitions=8" in Path(graph["hlo_file"]).read_text()
        assert graph["memory_per_device"]["peak_bytes"] > graph["argument_bytes_per_device"]


# The hand calculation of docs/inspector.md: TinyGPT(vocab 64, d 64, 2 blocks, seq 32) on mesh
# (data 4, model 2). Per device, in f32 elements: sharded on 'model' (halved): wte 64x64, wpe
# 32x64, lm_head 64x64, and per block qkv 192x64 + 192, attn_out 64x64, fc_in 256x64 + 256,
# fc_out 64x256; replicated: per block ln1, ln2 (2 x 64 each), attn_out.bias 64, fc_out.bias 64;
# ln_f 2 x 64.
SHARDED = 64 * 64 + 32 * 64 + 64 * 64 + 2 * (192 * 64 + 192 + 64 * 64 + 256 * 64 + 256 + 64 * 256)
REPLICATED = 2 * (4 * 64 + 64 + 64) + 2 * 64
PARAM_BYTES_PER_DEVICE = 4 * (SHARDED // 2 + REPLICATED)  # 222,464
TOKEN_BYTES_PER_DEVICE = 8 * (16 // 4) * 33  # int64 [16, 33] split 4 ways on 'data': 1,056


def test_argument_bytes_agree_with_the_hand_calculation(cli_run):
    _, report, _ = cli_run
    first = report["graphs"][0]
    params = first["parameters"]
    model_bytes = sum(p["bytes_per_device"] for p in params if p["name"])
    assert model_bytes == PARAM_BYTES_PER_DEVICE == 222_464
    (tokens,) = [p for p in params if p["global_shape"] == "s64[16,33]"]
    assert tokens["shape"] == "s64[4,33]"
    assert tokens["bytes_per_device"] == TOKEN_BYTES_PER_DEVICE == 1_056
    assert first["argument_bytes_per_device"] == 222_464 + 1_056 + 64  # + 11 scalars (docs/inspector.md)
    # The parameters are updated in place: XLA writes the new weights into their buffers.
    assert first["memory_per_device"]["alias_bytes"] == PARAM_BYTES_PER_DEVICE


def test_row_parallel_all_reduce_agrees_with_the_hand_calculation(cli_run):
    _, report, _ = cli_run
    first = report["graphs"][0]
    attn_out = [c for c in first["collectives"] if c["scope"] == "blocks.0.attn_out"]
    forward = [c for c in attn_out if c["op"] == "all-reduce" and c["shape"] == "f32[128,64]"]
    assert len(forward) == 1
    (ar,) = forward
    # 16 sequences / 4 data shards x 32 tokens = 128 rows of 64 f32: 32 KiB, over the 2
    # 'model' devices; a ring all-reduce sends 2 (n - 1) / n of it = 32 KiB.
    assert ar["result_bytes"] == 128 * 64 * 4 == 32768
    assert ar["group_size"] == 2 and ar["num_groups"] == 4
    assert ar["bytes_sent_per_device"] == 32768


CRASHING_SCRIPT = """
import numpy as np, torch, torch_xla
import spmd
from mesh import Mesh
spmd.enable_spmd()
mesh = Mesh(np.arange(8), (8,), ("data",))
x = spmd.mark_sharding(torch.ones(64, 16).to(torch_xla.device()), mesh, ("data", None))
for step in range(2):
    x = (x @ torch.ones(16, 16).to(torch_xla.device())).relu() + step
    torch_xla.sync()
raise ValueError("boom after two steps")
"""


def test_a_crashing_script_still_gets_a_partial_report(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_SCRIPT)
    json_path = tmp_path / "report.json"
    env = child_env()
    run = subprocess.run(
        [sys.executable, "-m", "spmd.inspector", "--json", str(json_path), str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 1  # the script's failure, kept
    assert "PARTIAL REPORT: the block raised ValueError: boom after two steps" in run.stdout
    assert "ValueError: boom after two steps" in run.stderr  # its traceback
    report = json.loads(json_path.read_text())
    assert report["partial"].startswith("the block raised ValueError") and len(report["graphs"]) == 2


def test_a_dump_directory_reused_by_a_second_run_reports_that_run(tmp_path):
    """XLA numbers modules from 0 in every process, so the second run overwrites the first's
    files; its graphs are found by their new files, not missed as already known."""
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_SCRIPT)
    env = child_env()
    command = [sys.executable, "-m", "spmd.inspector", "--dump-dir", str(tmp_path / "dumps"), str(script)]
    runs = [subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600) for _ in range(2)]
    for run in runs:
        assert run.returncode == 1 and "spmd.inspector: 2 compiled graph(s)" in run.stdout, run.stderr[-2000:]
        assert "step 0: 1 graph(s)" in run.stdout and "step 1: 1 graph(s)" in run.stdout


def test_docs_sample_output_is_current(cli_run):
    """docs/inspector.md shows this run's output; its figures must be what the CLI prints now."""
    stdout, _, _ = cli_run
    doc = (ROOT / "docs" / "inspector.md").read_text()
    sample = doc.split("examples/train_spmd.py`\n", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    figures = [line.strip() for line in sample.splitlines() if "per-device peak" in line or line.startswith("step ")]
    assert len(figures) == 4
    for line in figures:
        assert line in stdout, line
