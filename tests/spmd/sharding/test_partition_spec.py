import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spmd import DuplicateAxisError, P, PartitionSpec, PartitionSpecTypeError


def test_entries_and_normalization():
    spec = P("data", None, ("x", "y"), 1)
    assert spec.entries == ("data", None, ("x", "y"), 1)
    assert P(("x",)) == P("x")
    assert P(()) == P(None)
    assert P(["x", "y"]) == P(("x", "y"))
    assert spec.mesh_axes() == ("data", "x", "y", 1)
    assert spec.padded(6) == ("data", None, ("x", "y"), 1, None, None)


def test_value_type_not_tuple():
    spec = P("x", None)
    assert not isinstance(spec, tuple)
    assert spec != ("x", None)
    assert hash(spec) == hash(P("x", None))
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert repr(spec) == "P('x', None)"
    with pytest.raises(AttributeError):
        spec._entries = ()
    assert PartitionSpec is P
    assert len(P()) == 0 and list(P("a", "b")) == ["a", "b"] and P("a", "b")[1] == "b"


def test_from_value_accepts_torch_xla_tuples():
    assert PartitionSpec.from_value(("x", None)) == P("x", None)
    assert PartitionSpec.from_value(P("x")) == P("x")
    with pytest.raises(PartitionSpecTypeError, match=r"Write P\('x'\)"):
        PartitionSpec.from_value("x")


def test_bad_entries():
    with pytest.raises(PartitionSpecTypeError, match=r"1.5 \(float\) is not a mesh axis"):
        P("x", 1.5)
    with pytest.raises(PartitionSpecTypeError, match="True"):
        P(True)
    with pytest.raises(PartitionSpecTypeError):
        P(("x", ("y",)))


@pytest.mark.parametrize("bad", ["", " ", "a-b", "1x"])
def test_axis_names_are_identifiers_as_mesh_requires(bad):
    with pytest.raises(PartitionSpecTypeError, match="non-empty identifiers"):
        P(bad)
    with pytest.raises(PartitionSpecTypeError, match="entry 1 names mesh axis"):
        P("data", ("x", bad))


@pytest.mark.parametrize(
    "build, error, names",
    [
        (lambda: P(*[f"a{i}" for i in range(100000)], "a0"), DuplicateAxisError, ["'a0'", "100001 entries"]),
        (lambda: P(*range(100000), 1.5), PartitionSpecTypeError, ["entry 100000", "1.5 (float)", "100001 entries"]),
    ],
)
def test_messages_about_huge_specs_stay_short(build, error, names):
    with pytest.raises(error) as info:
        build()
    assert len(str(info.value)) < 400 and all(n in str(info.value) for n in names)


def test_axis_used_twice():
    with pytest.raises(DuplicateAxisError, match=r"P\('x', 'x'\) uses mesh axis 'x' more than once"):
        P("x", "x")
    with pytest.raises(DuplicateAxisError, match="more than once"):
        P(("x", "y"), "y")


names = st.sampled_from(["a", "b", "c", "d"])
entries = st.one_of(st.none(), names, st.lists(names, min_size=2, max_size=3, unique=True).map(tuple))


@given(st.lists(entries, max_size=4))
def test_roundtrip_or_duplicate(raw):
    flat = [a for e in raw if e is not None for a in (e if isinstance(e, tuple) else (e,))]
    if len(flat) != len(set(flat)):
        with pytest.raises(DuplicateAxisError):
            P(*raw)
        return
    spec = P(*raw)
    assert P(*spec.entries) == spec
    assert spec.mesh_axes() == tuple(flat)
