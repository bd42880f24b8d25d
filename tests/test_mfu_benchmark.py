"""examples/mfu_benchmark.py runs each strategy and the torch_xla baseline, and its MFU figures
are the FLOP formulas over the measured step time."""

import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_benchmark_table_json_and_plot(xla, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("mfu_benchmark", EXAMPLES / "mfu_benchmark.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out_json = tmp_path / "mfu.json"
    config = tmp_path / "config.json"  # one block: the compiles are most of this test's time
    config.write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 4, "vocab_size": 512}))
    args = ["--config", str(config), "--strategies", "dp", "--batch", "8", "--seq", "32"]
    out = bench.main([*args, "--steps", "2", "--warmup", "2", "--json", str(out_json)])
    printed = capsys.readouterr().out
    assert "strategy" in printed and "torch_xla" in printed and "MFU 6N" in printed
    data = json.loads(out_json.read_text())
    assert [r["strategy"] for r in data["results"]] == ["dp", "torch_xla"]
    assert out_json.with_suffix(".png").stat().st_size > 1000
    for r in data["results"]:
        t = r["step_seconds"]
        assert r["step_seconds_min"] <= t <= r["step_seconds_max"]
        for key in ("6n", "palm", "matmul"):
            expected = data["flops_per_step"][key] / t / data["chips"] / data["peak_flops_per_chip"]
            assert r[f"mfu_{key}"] == pytest.approx(expected)
        assert r["peak_bytes_per_device"] > 0
    assert data["results"][1]["step_time_over_torch_xla"] == 1.0
    assert out["platform"] == "CPU"
