"""configure_default_devices: CPU devices for torch_xla and JAX, the memory-aware CPU scheduler,
and nothing changed when a device is already chosen."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import spmd.devices
from mesh import DeviceCountError
from spmd import configure_default_devices

ROOT = str(Path(__file__).resolve().parents[2])  # this checkout's code, not an installed copy


def run(code, env):
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


@pytest.fixture
def configured(monkeypatch):
    """``configured(env)``: what configure_default_devices(8) returns and leaves in XLA_FLAGS when
    the device settings of the environment are ``env`` alone, as in a process started with it.
    In this process, the environment restored after: with PJRT_DEVICE given and no
    CPU_NUM_DEVICES, the function reads and writes only those variables (no runtime or TPU
    probe), so a process of its own for each case (2.5 s of importing torch) added nothing."""

    def call(env):
        for name in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "XLA_FLAGS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert "PJRT_DEVICE" in env  # else it would probe for a TPU: a fresh process's business
        return configure_default_devices(8), os.environ.get("XLA_FLAGS", "")

    return call


def test_cpu_gets_devices_and_the_memory_aware_scheduler(configured):
    device, flags = configured({"PJRT_DEVICE": "CPU"})
    assert device == "CPU"
    assert "--xla_force_host_platform_device_count=8" in flags
    assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in flags


def test_user_flags_win(configured):
    _, flags = configured({"PJRT_DEVICE": "CPU", "XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=true"})
    assert flags.count("xla_cpu_enable_concurrency_optimized_scheduler") == 1
    assert "=true" in flags


@pytest.mark.parametrize("device", ["TPU", "CUDA"])
def test_a_chosen_accelerator_is_left_alone(configured, device):
    got, flags = configured({"PJRT_DEVICE": device})
    assert got == device and flags == ""


@pytest.fixture
def cpu_env(monkeypatch):
    """A process environment with the CPU chosen and no count set yet (restored after)."""
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    return monkeypatch


@pytest.mark.parametrize("value", ["0", "x", "-1", "", "100000"])
def test_a_bad_count_in_the_environment_is_refused_before_torch_xla_reads_it(cpu_env, value):
    cpu_env.setenv("CPU_NUM_DEVICES", value)  # torch_xla 2.9 segfaults on '0' and aborts on 'x'
    with pytest.raises(
        DeviceCountError,
        match=rf"CPU_NUM_DEVICES={value!r} in the environment .*unset it for 8\): give a whole number .* from 1 to 4096",
    ):
        configure_default_devices(8)


def test_the_environment_count_wins_and_a_numpy_count_is_an_int(cpu_env):
    # Before any runtime starts (other tests in this process may have started JAX's or torch_xla's).
    cpu_env.setattr(spmd.devices, "_runtime_started", lambda: False)
    cpu_env.setenv("CPU_NUM_DEVICES", "4")
    configure_default_devices(8)
    assert spmd.devices.os.environ["CPU_NUM_DEVICES"] == "4"
    cpu_env.delenv("CPU_NUM_DEVICES")
    configure_default_devices(np.int64(2))
    assert spmd.devices.os.environ["CPU_NUM_DEVICES"] == "2"


def test_the_first_count_wins_and_a_call_too_late_to_change_it_is_refused():
    pytest.importorskip("torch_xla", reason="the runtime that starts here is torch_xla's")
    code = (
        "import os, spmd; spmd.configure_default_devices(4); spmd.configure_default_devices(2); "
        "print(os.environ['CPU_NUM_DEVICES']); print(os.environ['XLA_FLAGS']); "
        "import torch, torch_xla; spmd.enable_spmd(); print(spmd.device_count()); spmd.configure_default_devices(4)\n"
        "try:\n    spmd.configure_default_devices(2)\nexcept ValueError as e:\n    print(f'{type(e).__name__}: {e}')"
    )
    count, flags, devices, error = run(code, {})
    assert count == "4" and devices == "4"  # `spmd.inspector --devices 4` then the script's own call: 4
    assert "--xla_force_host_platform_device_count=4" in flags.split()
    assert error.startswith("DeviceCountError: configure_default_devices(2): the runtime already started with 4")
