"""XLA's dump directory: `prepare` refuses a path it cannot dump to (and then changes nothing),
`list_modules` and `read_graph` refuse what is not a dump directory or a module's name."""

import os

import pytest

from spmd.inspector import list_modules, prepare, read_graph

GRAPH = "HloModule m\nENTRY %e {\n  ROOT %p = f32[] parameter(0)\n}\n"


@pytest.fixture
def no_flags(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("XLA_HLO_DEBUG", raising=False)


def test_prepare_dumps_to_the_directory_given(tmp_path, no_flags):
    target = tmp_path / "new" / "dumps"
    assert prepare(target) == target and target.is_dir()
    assert f"--xla_dump_to={target}" in os.environ["XLA_FLAGS"]


@pytest.mark.parametrize(
    "where, error, match",
    [
        ("file", ValueError, "dump directory .*/f exists and is not a directory"),
        ("/proc/dumps", ValueError, r"cannot create the dump directory /proc/dumps \(No such file"),
        (5, TypeError, r"prepare\(dump_dir\) must be a directory path \(str or os.PathLike\), got int 5"),
    ],
)
def test_prepare_refuses_a_path_it_cannot_dump_to(tmp_path, no_flags, where, error, match):
    """A file, an impossible path or an int raised from inside pathlib (FileExistsError...)."""
    if where == "file":
        where = tmp_path / "f"
        where.write_text("x")
    with pytest.raises(error, match=match):
        prepare(where)
    assert "XLA_FLAGS" not in os.environ and "XLA_HLO_DEBUG" not in os.environ


def test_list_modules_and_read_graph_refuse_bad_arguments(tmp_path):
    (tmp_path / "foo.x.after_optimizations.txt").write_text(GRAPH)
    with pytest.raises(TypeError, match="dump_dir must be a directory path .*got int 5"):
        list_modules(5)
    with pytest.raises(ValueError, match="'foo' is not a module's dump name: XLA names them module_NNNN"):
        read_graph(tmp_path, "foo")
    with pytest.raises(TypeError, match="prefix must be a dump name string, got NoneType"):
        read_graph(tmp_path, None)
    (tmp_path / "module_0003.x.before_optimizations.txt").write_text(GRAPH)
    (tmp_path / "module_0003.x.after_optimizations.txt").write_text(GRAPH)
    assert list_modules(tmp_path) == {3: "module_0003.x"}
    assert read_graph(tmp_path, "module_0003.x").module_id == 3
