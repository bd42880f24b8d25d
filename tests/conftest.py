"""Test setup: 8 virtual CPU devices for torch_xla and JAX, XLA:CPU's code generation at -O0
(tests/torchrun.py, ``TEST_XLA_FLAGS``), and XLA dumps for the inspector, all set before either
library is imported (XLA reads its flags once per process).

The suite runs on both lanes. On the current lane (no torch_xla) every test that needs it is
skipped with the reason: tests that use the ``xla`` fixture, and tests marked ``torch_xla``.
"""

import importlib.util
import os

from spmd.devices import configure_default_devices
from spmd.inspector.dump import prepare
from tests.torchrun import TEST_XLA_FLAGS

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
configure_default_devices(8)
INSPECTOR_DUMP_DIR = prepare()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mesh import Mesh  # noqa: E402

HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
NEEDS_TORCH_XLA = "needs torch_xla: this is the current lane; the torch_xla lane runs it (pip install -e '.[dev]')"


def _skip_what_needs_torch_xla(items) -> None:
    """On the current lane, skip what needs torch_xla."""
    if HAS_TORCH_XLA:
        return
    skip = pytest.mark.skip(reason=NEEDS_TORCH_XLA)
    for item in items:
        if "xla" in getattr(item, "fixturenames", ()) or item.get_closest_marker("torch_xla"):
            item.add_marker(skip)


# Scripts the tests run in subprocesses; importing them would configure other devices.
collect_ignore = ["compat/torch_xla_style_script.py"]
collect_ignore_glob = ["*_worker.py"]  # (--doctest-modules would import them, running their setup here)


# Started before the first test on the torch_xla lane: autograd's engine sizes its per-device
# queues once, at the first backward, from the devices there are then, so an XLA backward after a
# CPU one run first in the session failed an internal assert (engine.cpp, torch 2.9).
@pytest.fixture(scope="session", autouse=HAS_TORCH_XLA)
def xla():
    """torch_xla in SPMD mode on the 8 devices; yields the XLA device."""
    import torch_xla
    import torch_xla.runtime as xr

    xr.use_spmd()
    if xr.global_runtime_device_count() != 8:
        pytest.fail(f"expected 8 virtual devices, got {xr.global_runtime_device_count()}")
    return torch_xla.device()


@pytest.fixture(autouse=True)
def _restore_global_mesh():
    """Each test starts and ends with no global mesh (FSDPTrainer, for one, sets one)."""
    from mesh import set_global_mesh

    set_global_mesh(None)
    yield
    set_global_mesh(None)


@pytest.fixture
def mesh_4x2() -> Mesh:
    return Mesh(np.arange(8), (4, 2), ("data", "model"))


def pytest_sessionfinish(session, exitstatus):
    """Remove the XLA dumps of this session, and stop the background runs if they still go."""
    import shutil

    from tests import background
    from tests.fsdp_xla import chaos_runs
    from tests.spmd.plan import plan_results
    from tests.torchrun import stop_warm_parent

    background.stop_all()
    plan_results.remove_output()
    chaos_runs.remove_output()
    stop_warm_parent()
    shutil.rmtree(INSPECTOR_DUMP_DIR, ignore_errors=True)


def pytest_collection_modifyitems(session, config, items):
    """The tests that read background runs (tests/background.py: the planner's compiles, its
    worker's in plan_results.py and their modules' own; the launches that mostly wait; torchft's
    chaos runs, chaos_runs.py) run last, so the runs overlap with everything else (the order of
    the rest is kept)."""
    from tests.background import runs_read_by
    from tests.fsdp_xla import chaos_runs
    from tests.spmd.plan import plan_results

    _skip_what_needs_torch_xla(items)
    rest, children, readers = [], [], []
    for item in items:
        if plan_results.needed([item.nodeid]) or chaos_runs.needed([item.nodeid]):
            readers.append(item)
        elif runs_read_by(item):
            children.append(item)
        else:
            rest.append(item)
    items[:] = rest + children + readers


def pytest_collection_finish(session):
    """Start the background runs as soon as the tests are known: the planner's TPU compiles
    (tests/spmd/plan) on the spare core, the launches that mostly wait, and torchft's chaos
    runs, in their own processes while other tests run."""
    from tests import background
    from tests.fsdp_xla import chaos_runs
    from tests.spmd.plan import plan_results

    nodeids = [item.nodeid for item in session.items]
    chaos_runs.start(chaos_runs.needed(nodeids))
    if plan_results.needed(nodeids):
        plan_results.start(session.items)
    background.queue([run for item in session.items for run in background.runs_read_by(item)])  # once each
