"""The session's background runs (tests/background.py): every run a test module holds is read by
a test that says so (``@pytest.mark.reads``), so the session queues it when that test is
selected; a run no marked test reads would start only when read, in the foreground."""

import importlib
from pathlib import Path

import pytest

from tests.background import BackgroundRun

TESTS = Path(__file__).parent


def _held(value) -> list[BackgroundRun]:
    """The runs ``value`` is or holds (a module-level run, or a tuple or dict of them)."""
    if isinstance(value, BackgroundRun):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [run for item in value for run in _held(item)]
    return []


def _marks(test) -> list:
    """A test function's marks, with those of its parametrized cases (``pytest.param(marks=)``)."""
    marks = list(getattr(test, "pytestmark", []))
    for mark in [m for m in marks if m.name == "parametrize"]:
        marks += [m for case in mark.args[1] if hasattr(case, "marks") for m in case.marks]
    return marks


def _runs_and_reads(module_name: str) -> tuple[list[BackgroundRun], list[BackgroundRun]]:
    """The module-level runs of a test module, and the runs its tests' ``reads`` marks name."""
    module = importlib.import_module(module_name)
    runs = [run for value in vars(module).values() for run in _held(value)]
    read = [
        run
        for test in vars(module).values()
        if callable(test) and getattr(test, "__name__", "").startswith("test_")
        for mark in _marks(test)
        if mark.name == "reads"
        for run in mark.args
    ]
    return runs, read


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


# The test modules that hold a run (those that name a way to make one and define one).
MODULES = sorted(
    _module_name(p)
    for p in TESTS.rglob("test_*.py")
    if any(word in p.read_text() for word in ("BackgroundRun", "child_compile", "torchrun_in_background"))
    and _runs_and_reads(_module_name(p))[0]
)


@pytest.mark.parametrize("name", MODULES)
def test_every_run_of_a_module_is_read_by_a_marked_test(name):
    runs, read = _runs_and_reads(name)
    unread = [run for run in runs if not any(run is r for r in read)]
    assert not unread, f"{name}: {len(unread)} of its runs have no test marked @pytest.mark.reads(...)"


def test_the_modules_with_runs_are_found():
    expected = {"tests.spmd.plan.test_quiet_start", "tests.spmd.plan.test_layer_period", "tests.test_multiprocess"}
    assert expected | {"tests.spmd.test_dtensor_backend", "tests.spmd.plan.test_fused_backward"} <= set(MODULES)
