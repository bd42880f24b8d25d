"""The planner's mesh follows the device order the installed jax gives, and says which: jax 0.12
gives TPU7x's core axis (a chip's two TensorCores) to the busiest mesh axis first, jax 0.10.2 and
0.7.1 treat it like x, y and z. Mock devices here; libtpu's own devices in a subprocess here and
in plan_worker.py (test_ironwood.py)."""

import importlib.metadata
import subprocess
import sys

import pytest

from spmd.plan._jax_compat import _MockTpu, core_axis_first, device_order
from spmd.plan.request.meshes import build_mesh
from spmd.plan.request.topology import parse_slice
from tests.torchrun import child_env

JAX = importlib.metadata.version("jax")
JAX_MINOR = tuple(int(v) for v in JAX.split(".")[:2])
LIBTPU = tuple(int(v) for v in importlib.metadata.version("libtpu").split(".")[:3])


def tpu7x_devices(x: int, y: int, z: int) -> list[_MockTpu]:
    """TPU7x devices of an x-by-y-by-z chip grid in libtpu's order: x fastest, a chip's two cores adjacent."""
    chips = [(i, j, k) for k in range(z) for j in range(y) for i in range(x)]
    return [_MockTpu(2 * n + core, chip, core) for n, chip in enumerate(chips) for core in (0, 1)]


@pytest.mark.smoke
@pytest.mark.skipif(JAX_MINOR == (0, 11), reason="jax 0.11 was not measured (the lanes have 0.7.1, 0.10.2 and 0.12)")
def test_jax_0_12_and_only_it_puts_the_core_axis_first():
    assert core_axis_first() == (JAX_MINOR >= (0, 12)), JAX


def test_the_order_is_named_with_the_jax_version():
    expected = "core axis first" if core_axis_first() else "core axis like x, y, z"
    assert device_order(tpu7x_devices(2, 2, 1)) == f"jax {JAX} mesh_utils ({expected})"
    v5e = [_MockTpu(0, (0, 0, 0), 0, device_kind="TPU v5 lite")]
    assert device_order(v5e) == f"jax {JAX} mesh_utils"  # one device per chip: no core axis to rank


@pytest.mark.smoke
def test_the_planner_s_mesh_on_tpu7x_follows_the_installed_jax():
    """tpu7x:2x4x4 (32 chips, 64 devices; past jax's small-slice ring rule) as fsdp=32 x tensor=2:
    each tensor pair is one chip's two cores where jax ranks the core axis first."""
    devices = tpu7x_devices(2, 4, 4)
    mesh = build_mesh({"fsdp": 32, "tensor": 2}, parse_slice("tpu7x:2x4x4"), devices)
    pairs = mesh.device_ids.reshape(32, 2)
    same_chip = [devices[a].coords == devices[b].coords for a, b in pairs]
    assert all(same_chip) if core_axis_first() else not any(same_chip)
    if not core_axis_first():  # jax 0.10.2: the pair is two chips along x
        assert all(devices[a].coords[0] != devices[b].coords[0] for a, b in pairs)


LIBTPU_TPU7X = """
from spmd.plan._jax_compat import device_order, topology_devices
devices = topology_devices("tpu7x:2x2x1", 1, "TPU7x")
print(len(devices), devices[0].device_kind, "|", device_order(devices))
"""


@pytest.mark.smoke
@pytest.mark.skipif(LIBTPU < (0, 0, 42), reason="libtpu < 0.0.42 knows no tpu7x (the torch_xla lane)")
def test_libtpu_gives_tpu7x_devices_and_their_order_is_named():
    """libtpu loads beside this jax (in a subprocess: libtpu stays out of the test session) and
    its TPU7x devices are named as the mock ones are."""
    run = subprocess.run(
        [sys.executable, "-c", LIBTPU_TPU7X], env=child_env(xla=False), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == f"8 TPU7x | {device_order(tpu7x_devices(2, 2, 1))}"
