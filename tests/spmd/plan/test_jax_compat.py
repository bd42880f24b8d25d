"""The torchax shim on this lane's torch: torchax imports and runs a model through it, the
stand-ins are gone afterwards and fail loudly if reached, and the shim says when it is no
longer needed. On the torch_xla lane (torch 2.9) torch lacks none of the names: the shim is idle."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from spmd.plan._jax_compat import (
    TORCHAX_REMOVED_OPERATORS,
    TORCHAX_REMOVED_OVERLOADS,
    _StandIn,
    aten_stand_ins,
    import_torchax,
    missing_aten_names,
)
from spmd.plan.errors import StandInReachedError, TracingError
from tests.torchrun import child_env

TORCH = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


def test_torch_lacks_exactly_the_names_the_shim_lists():
    missing = missing_aten_names()
    listed = len(TORCHAX_REMOVED_OPERATORS) + sum(len(v) for v in TORCHAX_REMOVED_OVERLOADS.values())
    if TORCH >= (2, 14):
        assert len(missing) == listed == 23  # 2 operators, 21 named-tensor overloads
    else:
        assert missing == []  # torch 2.9 still has them: nothing to stand in for


@pytest.mark.smoke
def test_torchax_runs_a_model_through_the_shim():
    torchax = import_torchax()  # fails on torch >= 2.14 if a stand-in is missing
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    expected = model(x)
    env = torchax.tensor.Environment()
    with env:
        got = model.to("jax")(x.to("jax"))
        values = np.asarray(got.jax())  # run by JAX (on the CPU), read back
    np.testing.assert_allclose(values, expected.detach().numpy(), atol=1e-5)
    # The stand-ins are gone again: torch answers as it did before.
    for name in missing_aten_names():
        packet, _, overload = name.partition(".")
        assert not hasattr(torch.ops.aten, packet) or (
            overload and not hasattr(getattr(torch.ops.aten, packet), overload)
        )


def test_a_stand_in_fails_loudly_with_a_typed_error():
    with pytest.raises(StandInReachedError, match=r"reached aten\.qr, which torch .* removed.*torch\.linalg forms"):
        _StandIn("qr")(torch.zeros(2, 2))
    assert issubclass(StandInReachedError, TracingError)
    with aten_stand_ins() as given:
        for name in given:
            packet, _, overload = name.partition(".")
            found = getattr(getattr(torch.ops.aten, packet), overload) if overload else getattr(torch.ops.aten, packet)
            with pytest.raises(StandInReachedError, match=f"aten.{name}"):
                found()


# torchax with the flax placeholder (a packaging matter, not torch's) but no ATen stand-ins.
NO_SHIM = """
from spmd.plan._jax_compat import _flax_placeholder
with _flax_placeholder():
    import torchax
    torchax.default_env()
print("imported")
"""


def test_the_shim_is_still_needed():
    """Fails, saying so, once torchax imports on this torch without the shim: then delete the
    stand-ins from spmd/plan/_jax_compat.py (and this test's expectation)."""
    done = subprocess.run([sys.executable, "-c", NO_SHIM], env=child_env(xla=False), capture_output=True, text=True)
    imported = done.returncode == 0 and "imported" in done.stdout
    if not missing_aten_names():
        assert imported, done.stderr[-2000:]  # nothing removed on this torch: torchax imports as it is
        return
    assert not imported, (
        f"torchax {torch.__version__} imports without the planner's ATen stand-ins: the shim is no longer needed; "
        "remove TORCHAX_REMOVED_* and aten_stand_ins from spmd/plan/_jax_compat.py."
    )
    assert "has no overload name" in done.stderr or "no attribute" in done.stderr, done.stderr[-2000:]


def test_planning_leaves_this_process_s_accelerator_alone():
    """torchax names PrivateUse1 'jax'; it must not become the process's accelerator (on torch
    2.15 Adam's step then raised "PyTorch is not linked with support for jax devices")."""
    code = (
        "import torch\n"
        "before = torch.accelerator.current_accelerator(check_available=True)\n"
        "from spmd.plan._jax_compat import import_torchax\n"
        "import_torchax()\n"
        "assert torch.tensor([1.0]).device.type == 'cpu'\n"
        "assert torch.accelerator.current_accelerator(check_available=True) == before, 'accelerator changed'\n"
        "model = torch.nn.Linear(2, 2)\n"
        "optimizer = torch.optim.Adam(model.parameters())\n"
        "model(torch.ones(1, 2)).sum().backward()\n"
        "optimizer.step()\n"
        "from spmd._backend.dtensor_backend import process_device_type\n"
        "print(process_device_type())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "cpu"
