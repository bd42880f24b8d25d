"""SPMD mode must be on before tensors reach the device; we raise instead of crashing later."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(code: str) -> subprocess.CompletedProcess:
    prelude = "from spmd import configure_default_devices; configure_default_devices()\n"
    env = {k: v for k, v in os.environ.items() if k != "XLA_USE_SPMD"}  # use_spmd() in this process sets it
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.torch_xla
def test_late_spmd_raises_clear_error():
    r = run(
        """
        import numpy as np, torch, torch_xla
        import spmd
        t = torch.ones(8).to(torch_xla.device())
        try:
            spmd.mark_sharding(t, spmd.Mesh(np.arange(8), (8,), ("x",)), spmd.P("x"))
        except spmd.SpmdModeError as e:
            print("raised:", e)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "raised: SPMD mode is off and tensors already live on the XLA device" in r.stdout
    assert "spmd.enable_spmd()" in r.stdout


@pytest.mark.torch_xla
def test_mark_sharding_turns_spmd_on_when_nothing_is_on_device():
    r = run(
        """
        import numpy as np, torch, torch_xla, torch_xla.runtime as xr
        import spmd
        spmd.enable_spmd()
        t = torch.arange(8.0).to(torch_xla.device())
        spmd.mark_sharding(t, spmd.Mesh(np.arange(8), (8,), ("x",)), spmd.P("x"))
        print(xr.is_spmd(), (t * 2).sum().item())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("True 56.0")
