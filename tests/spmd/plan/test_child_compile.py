"""The planner's background runs (child_compile.py): every run a test module holds is read by a
test that says so (``@pytest.mark.reads``), so the session queues it when that test is selected;
a run no marked test reads would start only when read, in the foreground."""

import importlib
from pathlib import Path

import pytest

from tests.background import BackgroundRun

HERE = Path(__file__).parent


def _runs_and_reads(name: str) -> tuple[set[str], set[str]]:
    """The module-level runs of test module ``name``, and those its tests' ``reads`` marks name."""
    module = importlib.import_module(f"tests.spmd.plan.{name}")
    runs = {key for key, value in vars(module).items() if isinstance(value, BackgroundRun)}
    read = {
        key
        for test in vars(module).values()
        if callable(test)
        for mark in getattr(test, "pytestmark", [])
        if mark.name == "reads"
        for run in mark.args
        for key, value in vars(module).items()
        if value is run
    }
    return runs, read


# The test modules that hold a run (those that name BackgroundRun or child_compile and define one).
MODULES = sorted(
    p.stem
    for p in HERE.glob("test_*.py")
    if ("BackgroundRun" in p.read_text() or "child_compile" in p.read_text()) and _runs_and_reads(p.stem)[0]
)


@pytest.mark.parametrize("name", MODULES)
def test_every_run_of_a_module_is_read_by_a_marked_test(name):
    runs, read = _runs_and_reads(name)
    assert runs <= read, f"{name}: {sorted(runs - read)} have no test marked @pytest.mark.reads(...)"


def test_the_modules_with_runs_are_found():
    assert {"test_quiet_start", "test_vocab_tiling", "test_layer_period", "test_fused_backward"} <= set(MODULES)
