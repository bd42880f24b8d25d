"""`capture` on programs whose collectives and bytes are known by hand (8 devices, f32)."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from mesh import Mesh
from spmd import P, mark_sharding, with_sharding_constraint
from spmd.inspector import CollectiveKind, InspectorError, WarningCode, capture
from tests.torchrun import child_env


@pytest.fixture
def mesh8(xla):
    return Mesh(np.arange(8), (8,), ("x",))


def sync():
    import torch_xla

    torch_xla.sync()


def params_by_global_shape(graph, dims):
    return [p for p in graph.parameters if p.global_shape is not None and p.global_shape.dims == dims]


def test_batch_sharded_input_replicated_weight_has_no_collective(xla, mesh8):
    with capture() as report:
        x = torch.randn(64, 32).to(xla)
        w = torch.randn(32, 16).to(xla)
        mark_sharding(x, mesh8, P("x", None))
        y = x @ w
        sync()
    (graph,) = report.graphs
    assert graph.collectives == ()
    assert graph.num_partitions == 8
    assert y.shape == (64, 16)


def test_contraction_dim_sharding_gives_one_all_reduce_of_the_output(xla, mesh8):
    with capture() as report:
        x = torch.randn(64, 32).to(xla)
        w = torch.randn(32, 16).to(xla)
        mark_sharding(x, mesh8, P(None, "x"))
        mark_sharding(w, mesh8, P("x", None))
        y = x @ w
        sync()
    (graph,) = report.graphs
    (ar,) = graph.collectives
    assert ar.kind is CollectiveKind.ALL_REDUCE
    assert ar.shape == "f32[64,16]"
    assert ar.result_bytes == 64 * 16 * 4
    assert ar.group_size == 8
    assert ar.bytes_sent_per_device == 2 * 4096 * 7 // 8
    assert ar.op_type == "aten__mm"
    assert ar.source.endswith("test_capture.py:" + str(_line_of("y = x @ w", 2)))
    assert y.shape == (64, 16)


def _line_of(text, occurrence):
    lines = open(__file__).read().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if line.strip() == text]
    return hits[occurrence - 1]


def test_weight_sharded_on_output_dim_with_replicated_consumer_is_gathered_whole(xla, mesh8):
    with capture(replicated_threshold_bytes=1 << 30) as report:
        w = torch.randn(64, 32).to(xla)
        mark_sharding(w, mesh8, P("x", None))
        x = torch.randn(16, 32).to(xla)
        y = with_sharding_constraint(x @ w.T, mesh8, P())
        sync()
    graph = report.graphs[-1]
    (ag,) = graph.collectives
    assert ag.kind is CollectiveKind.ALL_GATHER
    assert ag.result_bytes == 64 * 32 * 4  # the full weight
    assert ag.bytes_sent_per_device == 64 * 32 * 4 * 7 // 8
    (weight,) = params_by_global_shape(graph, (64, 32))
    assert ag.source_parameter == weight.number
    assert y.shape == (16, 64)


def test_argument_bytes_of_an_8_way_sharded_tensor_are_one_eighth(xla, mesh8):
    with capture() as report:
        t = torch.randn(64, 256).to(xla)
        mark_sharding(t, mesh8, P("x", None))
        y = t * 2
        sync()
    graph = report.graphs[-1]
    (param,) = params_by_global_shape(graph, (64, 256))
    assert param.nbytes == 64 * 256 * 4 // 8
    assert param.shape.dims == (8, 256)
    assert param.sharding == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert graph.memory is not None
    assert graph.memory.argument_bytes == graph.argument_bytes
    assert graph.memory.peak_bytes >= graph.memory.argument_bytes + 8 * 256 * 4  # the output shard too
    assert y.shape == (64, 256)


def test_parameters_are_named_by_module_scope(xla, mesh8):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).to(xla)
    mark_sharding(model[0].weight, mesh8, P("x", None))
    mark_sharding(model[2].weight, mesh8, P(None, "x"))
    with capture() as report:
        x = torch.randn(8, 32).to(xla)
        out = model(x)
        out.sum().backward()
        sync()
    graph = report.graphs[-1]
    names = {p.name for p in graph.parameters}
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= names
    # Row-parallel 2.weight: the forward output is reduced over the shards, inside module "2".
    (reduce_out,) = [c for c in graph.collectives if c.shape == "f32[8,16]"]
    assert reduce_out.kind is CollectiveKind.ALL_REDUCE
    assert reduce_out.scope == "2"
    assert reduce_out.where == "2: aten__addmm"
    assert out.shape == (8, 16)


def test_a_forward_that_raises_closes_its_scope(xla, mesh8):
    class Raises(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(24, 40)

        def forward(self, x):
            self.inner(x)
            raise RuntimeError("caught by the script")

    bad, good = Raises().to(xla), torch.nn.Linear(24, 40).to(xla)  # shapes no other test compiles
    with capture() as report:
        x = torch.ones(8, 24).to(xla)
        with pytest.raises(RuntimeError, match="caught by the script"):
            bad(x)
        out = good(x).sum()
        sync()  # torch_xla's "Expecting scope to be empty" if a scope stayed open
    assert len(report.graphs) == 1 and out.shape == ()


def test_replicated_and_gathered_parameters_are_warned(xla, mesh8):
    with capture(replicated_threshold_bytes=4096) as report:
        w = torch.randn(64, 32).to(xla)
        mark_sharding(w, mesh8, P("x", None))
        big_replicated = torch.randn(64, 64).to(xla)
        x = torch.randn(16, 32).to(xla)
        y = with_sharding_constraint(x @ w.T, mesh8, P()) + big_replicated[:16]
        sync()
    codes = [w.code for w in report.warnings]
    assert WarningCode.PARAMETER_ALL_GATHER in codes
    assert WarningCode.REPLICATED_ARGUMENT in codes
    replicated = next(w for w in report.warnings if w.code is WarningCode.REPLICATED_ARGUMENT)
    assert "f32[64,64]" in replicated.message and "16.00 KiB" in replicated.message
    with capture(replicated_threshold_bytes=4096, ignore=["parameter-all-gather", "replicated-argument"]) as quiet:
        y2 = with_sharding_constraint(x @ w.T * 3, mesh8, P()) + big_replicated[:16]
        sync()
    assert not [w for w in quiet.warnings if w.code is not WarningCode.REPLICATED_ACTIVATION]
    assert y.shape == y2.shape


def test_recompilation_after_warmup_is_warned(xla, mesh8):
    x = torch.randn(16, 16).to(xla)
    with capture(warmup_steps=1) as report:
        for rows in (8, 12):  # a new input shape each step: a new graph each step
            y = x[:rows] * 2 + 1
            sync()
    assert sorted(report.steps) == [0, 1]
    (finding,) = [w for w in report.warnings if w.code is WarningCode.RECOMPILATION]
    assert "step 1" in finding.message
    assert y.shape == (12, 16)


def test_two_graphs_in_one_step_are_warned(xla, mesh8):
    x = torch.randn(16, 16).to(xla)
    with capture() as report:
        total = (x * 5).sum().item()  # executes mid-step
        y = x + total
        sync()
    assert len(report.steps[0]) == 2
    assert any(w.code is WarningCode.RECOMPILATION and "mid-step" in w.message for w in report.warnings)
    assert y.shape == (16, 16)


def test_nothing_compiled_is_an_error_not_an_empty_report(xla, mesh8):
    x = torch.randn(4, 4).to(xla)
    y = x + 1
    sync()
    with pytest.raises(InspectorError, match="No graph was compiled inside capture"):
        with capture() as report:
            y2 = x + 1  # the same graph: torch_xla reuses it
            sync()
    assert y2.shape == y.shape
    with pytest.raises(InspectorError, match="produced no report: No graph was compiled"):
        report.graphs  # noqa: B018


def test_report_is_unavailable_inside_the_block(xla):
    with pytest.raises(InspectorError, match="ready when"):
        with capture() as report:
            report.table()


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"name_modules": "no"}, TypeError, r"name_modules=...\) takes True or False, got 'no'"),
        ({"warmup_steps": 1.5}, TypeError, "warmup_steps must be a whole number >= 0, got float 1.5"),
        ({"replicated_threshold_bytes": float("nan")}, ValueError, "replicated_threshold_bytes must be a number"),
    ],
)
def test_bad_options_are_refused_before_the_block_runs(xla, options, error, match):
    """'no' named modules (truthy), nan silenced the replicated-tensor warnings: both accepted."""
    ran = []
    with pytest.raises(error, match=match):
        with capture(**options):
            ran.append(1)
    assert ran == []


@pytest.mark.torch_xla
def test_dumps_requested_too_late_name_the_cli(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(
        textwrap.dedent(
            """
            from spmd.devices import configure_default_devices
            configure_default_devices(8)
            import torch, torch_xla
            import spmd.inspector as inspector
            x = torch.ones(4, 4).to(torch_xla.device())
            y = x * 2
            torch_xla.sync()              # XLA reads its flags here: no dumps requested
            try:
                with inspector.capture():
                    z = x.sum() + x.mean()  # a new graph
                    torch_xla.sync()
            except inspector.InspectorError as e:
                print("ERROR:", e)
            """
        )
    )
    env = child_env()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ERROR: XLA compiled 1 graph(s) inside capture() but wrote no dump" in out.stdout
    assert "python -m spmd.inspector" in out.stdout
