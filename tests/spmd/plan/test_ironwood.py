"""The planner on TPU7x (Ironwood), and its typed errors that need libtpu or the tracer, from
plan_worker.py. On the current lane a config.json plans on tpu7x:2x2x1; on the torch_xla lane
(libtpu 0.0.20) the same command is refused, naming the current lane."""

import importlib.metadata
import json

import pytest

from spmd.plan import PlanReport
from spmd.plan._jax_compat import core_axis_first, device_order
from spmd.plan.request.meshes import build_mesh
from spmd.plan.request.topology import parse_slice
from tests.spmd.plan import plan_results
from tests.spmd.plan.test_device_order import tpu7x_devices
from tests.spmd.plan.test_plan import tiny_llama_params

LIBTPU = tuple(int(v) for v in importlib.metadata.version("libtpu").split(".")[:3])


@pytest.fixture(scope="module")
def worker():
    return plan_results.results()


@pytest.mark.skipif(LIBTPU < (0, 0, 42), reason="libtpu < 0.0.42 knows no tpu7x; the refusal is tested below")
def test_a_config_json_plans_on_tpu7x(worker):
    results, out = worker
    run = results["ironwood"]
    assert run["exit"] == 0, run
    report = PlanReport.from_dict(json.loads((out / "ironwood.json").read_text()))
    assert (report.chips, report.devices, report.mesh) == (4, 8, {"fsdp": 8})
    # fp32 parameters, AdamW's two moments and the int32 batch (one 128-token sequence per device), over 8 devices.
    math = (3 * 4 * tiny_llama_params() + 4 * 8 * 128) / 8
    assert abs(report.memory.argument_bytes - math) <= 0.03 * math
    assert report.memory.hbm_bytes == 96 * 2**30  # half of the chip's 192 GiB per device
    # The report names the compiler: the partitioner and the versions.
    assert report.toolchain["partitioner"] in ("Shardy", "GSPMD")
    assert report.toolchain["libtpu"] == importlib.metadata.version("libtpu")
    assert report.toolchain["device_order"] == device_order(tpu7x_devices(2, 2, 1))  # the installed jax's
    heading = run["stdout"].splitlines()[:2]
    assert "8 devices" in heading[0] and f"libtpu {report.toolchain['libtpu']}" in heading[1]
    assert f"mesh device order: {report.toolchain['device_order']}" in heading[1]
    assert "(per chip, 2 devices:" in run["stdout"]


@pytest.mark.skipif(LIBTPU < (0, 0, 42), reason="libtpu < 0.0.42 knows no tpu7x")
def test_libtpu_s_tpu7x_devices_order_as_the_mock_ones(worker):
    """The planner's mesh over libtpu's own devices of tpu7x:2x4x4 (fsdp=32 x tensor=2) is the
    mock devices' mesh (tests/spmd/plan/test_device_order.py): each tensor pair one chip's two
    cores where the installed jax ranks the core axis first (jax 0.12), two chips otherwise."""
    results, _ = worker
    run = results["device_orders"]
    chips = [tuple(c) for c in run["chips"]]
    pairs = list(zip(chips[0::2], chips[1::2]))
    assert len(pairs) == 32
    assert all(a == b for a, b in pairs) if core_axis_first() else not any(a == b for a, b in pairs)
    mock = build_mesh({"fsdp": 32, "tensor": 2}, parse_slice("tpu7x:2x4x4"), tpu7x_devices(2, 4, 4))
    assert run["ids"] == [int(i) for i in mock.device_ids]
    assert run["device_order"] == device_order(tpu7x_devices(2, 2, 1))


@pytest.mark.skipif(LIBTPU >= (0, 0, 42), reason="this libtpu compiles tpu7x: tested above")
def test_tpu7x_on_the_torch_xla_lane_names_the_current_lane(worker):
    results, _ = worker
    run = results["ironwood"]
    assert run["exit"] == 2
    (line,) = run["error"]
    assert line.startswith("error: libtpu 0.0.20 (jax 0.7.1) does not compile for TPU7x")
    assert 'pip install -e ".[dev-current]"' in line


def test_a_model_the_tracer_cannot_run_is_a_typed_error(worker):
    results, _ = worker
    kind, message = results["errors"]["untraceable"]
    assert kind == "TracingError"
    assert "could not run Branchy.forward on JAX tracers" in message and "no Python branch on a tensor" in message


def test_a_shape_libtpu_refuses_is_a_typed_error(worker):
    results, _ = worker
    kind, message = results["errors"]["bad_shape"]
    assert kind == "TopologyError" and "libtpu refuses the topology 'v5e:3x3'" in message
