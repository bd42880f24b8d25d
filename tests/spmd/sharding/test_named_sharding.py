"""(mesh, spec) -> HLO sharding: error messages, and conformance with JAX's NamedSharding."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh import Mesh, MeshTypeError
from spmd import (
    AxisIndexError,
    DuplicateAxisError,
    HloSharding,
    NamedSharding,
    P,
    PartitionSpecTypeError,
    SpecRankError,
    UnknownAxisError,
    hlo_sharding_for,
    resolve_spec,
)
from tests.spmd.specs import MESH_SHAPES, all_specs, make_mesh


def jax_hlo(mesh: Mesh, spec: tuple, rank: int) -> HloSharding:
    """JAX's HLO sharding for the same mesh and spec, with device positions mapped to ids."""
    import jax
    from jax.sharding import Mesh as JaxMesh
    from jax.sharding import NamedSharding as JaxNamedSharding
    from jax.sharding import PartitionSpec as JaxP

    devices = np.array(jax.devices())[mesh.device_ids].reshape(mesh.mesh_shape)
    jmesh = JaxMesh(devices, mesh.axis_names)
    text = str(JaxNamedSharding(jmesh, JaxP(*spec))._to_xla_hlo_sharding(rank))
    return HloSharding.parse(text).map_devices(mesh.device_ids.tolist())


def test_blog_examples():
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    assert str(hlo_sharding_for(mesh, P("model", "data"), 2)) == "{devices=[2,4]0,2,4,6,1,3,5,7}"
    mesh3 = Mesh(np.arange(8), (2, 2, 2), ("x", "y", "z"))
    assert str(hlo_sharding_for(mesh3, P("x", "z"), 2)) == ("{devices=[2,2,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}")
    assert str(hlo_sharding_for(mesh, P(0, 1), 2)) == "{devices=[4,2]0,1,2,3,4,5,6,7}"


def test_short_spec_replicates_trailing_dims():
    mesh = Mesh(np.arange(8), (8,), ("x",))
    assert hlo_sharding_for(mesh, P("x"), 3) == hlo_sharding_for(mesh, P("x", None, None), 3)
    assert hlo_sharding_for(mesh, P(), 0).is_replicated


def test_one_device_mesh_is_maximal():
    assert str(hlo_sharding_for(Mesh([5], (1,), ("x",)), P("x"), 2)) == "{maximal device=5}"


MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))


@pytest.mark.parametrize(
    "spec, shape, error, message",
    [
        (
            P("data", "tensor"),
            (8, 4),
            UnknownAxisError,
            r"tensor of shape \(8, 4\), spec P\('data', 'tensor'\), mesh\{'data': 4, 'model': 2\}: mesh axis "
            r"'tensor' is not in the mesh. Use one of \['data', 'model'\]",
        ),
        (
            P("data", None, "model"),
            (8, 4),
            SpecRankError,
            r"tensor of shape \(8, 4\), spec P\('data', None, 'model'\), .*: the spec has 3 entries but the "
            r"tensor has 2 dims. Give at most 2 entries",
        ),
        (P("data"), (), SpecRankError, r"For a scalar the spec is P\(\)"),
        (P(0, 2), (8, 4), AxisIndexError, r"mesh axis index 2 is out of range; the mesh has axes 0..1"),
        (P("data", 0), (8, 4), DuplicateAxisError, r"mesh axis 'data' is used twice \(as 'data' and 0\)"),
    ],
)
def test_errors_name_shape_spec_mesh_and_fix(spec, shape, error, message):
    with pytest.raises(error, match=message):
        hlo_sharding_for(MESH, spec, len(shape), shape)
    assert issubclass(error, ValueError)


def test_a_tuple_spec_is_read_as_a_partition_spec_and_other_arguments_are_typed():
    assert hlo_sharding_for(MESH, ("data",), 1) == hlo_sharding_for(MESH, P("data"), 1)
    assert resolve_spec(MESH, ["data", None], 2) == resolve_spec(MESH, P("data", None), 2)
    with pytest.raises(PartitionSpecTypeError, match=r"got 'data' \(str\). Write P\('data'\)"):
        resolve_spec(MESH, "data", 1)
    with pytest.raises(MeshTypeError, match=r"needs a Mesh first, got 'mesh' \(str\)"):
        resolve_spec("mesh", P(), 1)
    with pytest.raises(MeshTypeError, match="swapped"):
        hlo_sharding_for(P("data"), MESH, 1)


def test_named_sharding_value():
    s = NamedSharding(MESH, ("data", None))
    assert s == NamedSharding(MESH, P("data", None)) and hash(s) == hash(NamedSharding(MESH, P("data", None)))
    assert s.shard_shape((10, 3)) == (3, 3)
    assert s.is_fully_replicated(2) is False
    assert NamedSharding(MESH, P()).is_fully_replicated(2)
    assert repr(s) == "NamedSharding(mesh{'data': 4, 'model': 2}, P('data', None))"
    with pytest.raises(TypeError, match="needs a Mesh"):
        NamedSharding((4, 2), P())


@pytest.mark.parametrize("shape", MESH_SHAPES)
@pytest.mark.parametrize("permuted", [False, True])
def test_every_spec_matches_jax(shape, permuted):
    mesh = make_mesh(shape, permuted)
    count = 0
    for rank in (1, 2, 3):
        for spec in all_specs(len(shape), rank):
            ours = hlo_sharding_for(mesh, P(*spec), rank)
            assert ours == jax_hlo(mesh, spec, rank), (mesh, spec)
            count += 1
    assert count >= 9  # a 1-axis mesh has 2 + 3 + 4 specs over ranks 1..3


mesh_shapes = st.sampled_from(MESH_SHAPES)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_meshes_and_specs_match_jax(data):
    shape = data.draw(mesh_shapes)
    ids = np.array(data.draw(st.permutations(range(8))))
    mesh = Mesh(ids, shape, tuple("xyz"[: len(shape)]))
    rank = data.draw(st.integers(1, 3))
    spec = data.draw(st.sampled_from(list(all_specs(len(shape), rank))))
    cut = data.draw(st.integers(0, rank))  # also shorter specs: trailing dims replicated
    assert hlo_sharding_for(mesh, P(*spec[:cut]), rank) == jax_hlo(mesh, spec[:cut], rank)


def test_hlo_sharding_for_is_cached_and_keyed_on_exact_types():
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    first = hlo_sharding_for(mesh, P("data"), 2, (8, 4))
    assert hlo_sharding_for(mesh, P("data"), 2, (8, 4)) is first
    assert hlo_sharding_for(Mesh(np.arange(8), (4, 2), ("data", "model")), P("data"), 2, (8, 4)) is first  # equal mesh
    assert hlo_sharding_for(mesh, P("data"), 1) == hlo_sharding_for(mesh, ("data",), np.int64(1))
    # True == 1 and 8.0 == 8 hash alike: the cache must not hand them rank 1's or (8, 4)'s result
    with pytest.raises(SpecRankError, match="rank must be an int"):
        hlo_sharding_for(mesh, P("data"), True)
    with pytest.raises(SpecRankError, match="shape must be 2 non-negative ints"):
        hlo_sharding_for(mesh, P("data"), 2, (8.0, 4))


def test_a_named_sharding_checks_its_axes_without_computing_an_hlo_sharding(monkeypatch):
    import spmd.sharding._named_sharding as named

    computed = []
    monkeypatch.setattr(named, "_compute_hlo_sharding", lambda *args: computed.append(args))
    named._check_spec_on_mesh.cache_clear()
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    assert NamedSharding(mesh, ("data", "model")).spec == P("data", "model")
    with pytest.raises(UnknownAxisError, match="mesh axis 'x' is not in the mesh"):
        NamedSharding(mesh, P("x"))
    assert computed == []
