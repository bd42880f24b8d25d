"""The inspector is split where the mechanism differs and shares the rest: the two captures
(`spmd.inspector._xla`, `spmd.inspector._dtensor`) never import each other; the shared runner,
report, checks and CLI reach a capture only where the CLI chooses one (the report holds
torch_xla's graph values, which it re-exports)."""

import grimp
import pytest

SHARED = ("spmd.inspector._runner", "spmd.inspector.report", "spmd.inspector.checks", "spmd.inspector.memory")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("spmd", "mesh", exclude_type_checking_imports=True)


def _inside(module, package):
    return module == package or module.startswith(package + ".")


def _imports(graph, package):
    modules = {m for m in graph.modules if _inside(m, package)}
    return {(m, i) for m in modules for i in graph.find_modules_directly_imported_by(m)}


def test_the_captures_do_not_import_each_other(graph):
    xla, dtensor = "spmd.inspector._xla", "spmd.inspector._dtensor"
    assert {(m, i) for m, i in _imports(graph, xla) if _inside(i, dtensor)} == set()
    assert {(m, i) for m, i in _imports(graph, dtensor) if _inside(i, xla)} == set()


def test_the_shared_parts_do_not_depend_on_the_dry_run(graph):
    for shared in SHARED:
        assert {i for _, i in _imports(graph, shared) if _inside(i, "spmd.inspector._dtensor")} == set(), shared


def test_the_runner_needs_nothing_of_the_inspector(graph):
    assert {i for _, i in _imports(graph, "spmd.inspector._runner") if _inside(i, "spmd.inspector")} == set()


def test_the_cli_reaches_each_capture_through_its_cli(graph):
    captures = {i for _, i in _imports(graph, "spmd.inspector.cli") if _inside(i, "spmd.inspector._")}
    assert captures <= {"spmd.inspector._runner", "spmd.inspector._xla.cli", "spmd.inspector._dtensor.cli"}
