"""DTensor placements <-> PartitionSpec (spmd.sharding): pure conversions, no runtime."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import Partial, Replicate, Shard

from mesh import Mesh, MeshTypeError
from spmd import (
    P,
    PartialPlacementError,
    PlacementDimError,
    PlacementError,
    SpmdTypeError,
    placements_from_spec,
    spec_from_placements,
)
from spmd._util.torch_compat import is_strided_shard

MESH = Mesh(np.arange(8), (2, 4), ("data", "model"))


def test_torch_xlas_example_and_named_axes():
    # torch_xla's docstring example: [Replicate(), Shard(0)] over a (2, 4) mesh is (1, None, None).
    assert spec_from_placements([Replicate(), Shard(0)], MESH, 3, by_index=True) == P(1, None, None)
    assert spec_from_placements([Replicate(), Shard(0)], MESH, 3) == P("model", None, None)
    assert spec_from_placements([Shard(0), Shard(0)], MESH, 2) == P(("data", "model"), None)
    assert spec_from_placements([Shard(-1), Replicate()], MESH, 2) == P(None, "data")
    assert placements_from_spec(P("model", "data"), MESH, 2) == (Shard(1), Shard(0))
    assert placements_from_spec(P(), MESH, 2) == (Replicate(), Replicate())


def test_a_dim_split_against_mesh_order_is_a_strided_shard_and_back():
    placements = placements_from_spec(P(("model", "data")), MESH, 1)
    assert is_strided_shard(placements[0]) and placements[1] == Shard(0)
    assert spec_from_placements(placements, MESH, 1) == P(("model", "data"))


def test_bad_placements_raise_torch_xlas_exception_types_with_the_fix():
    with pytest.raises(PlacementError, match=r"Number of placements \(1\) must match mesh dimensions \(2\)") as e:
        spec_from_placements([Shard(0)], MESH, 2)
    assert isinstance(e.value, ValueError)
    with pytest.raises(PlacementDimError, match="Shard dimension 2 is out of bounds for tensor with 2 dimensions"):
        spec_from_placements([Shard(2), Replicate()], MESH, 2)
    with pytest.raises(IndexError):
        spec_from_placements([Shard(2), Replicate()], MESH, 2)
    with pytest.raises(PartialPlacementError, match="Partial placement is not implemented") as e:
        spec_from_placements([Partial(), Replicate()], MESH, 2)
    assert isinstance(e.value, NotImplementedError)
    with pytest.raises(PlacementError, match="'x' is not a placement"):
        spec_from_placements(["x", Replicate()], MESH, 2)


@pytest.mark.parametrize(
    "placements, mesh, rank, error, match",
    [
        (lambda: [Shard("x"), Replicate()], MESH, 1, PlacementError, "Shard takes an int tensor dim"),
        (lambda: [Shard(0), Replicate()], "mesh", 1, MeshTypeError, "needs a Mesh, got 'mesh'"),
        (lambda: None, MESH, 1, PlacementError, r"sequence of Shard\(dim\)/Replicate\(\).*got None"),
        (lambda: "SR", MESH, 1, PlacementError, "got 'SR'"),
        (lambda: [Shard(-3)], MESH, "", SpmdTypeError, "rank is an int"),
        (lambda: [Shard(2), Shard(2)], MESH, 324876587547, PlacementError, "0 to 63; got 324876587547"),
    ],
)
def test_arguments_of_the_wrong_type_or_range_are_named(placements, mesh, rank, error, match):
    try:
        made = placements()
    except TypeError:  # torch 2.15's Shard (C++) refuses a str dim itself
        pytest.skip("this torch's Shard takes an int dim only")
    with pytest.raises(error, match=match):
        spec_from_placements(made, mesh, rank)


def test_convert_to_xla_partition_spec_needs_a_tensor():
    from spmd.compat.api import convert_to_xla_partition_spec

    with pytest.raises(SpmdTypeError, match=r"needs a tensor first \(for its rank\), got 'x'"):
        convert_to_xla_partition_spec("x", [Shard(0)])
    with pytest.raises(PlacementError, match="got None"):
        convert_to_xla_partition_spec(torch.zeros(2), None)


MESHES = [
    Mesh(np.arange(8), shape, names)
    for shape, names in [((8,), ("a",)), ((2, 4), ("a", "b")), ((2, 2, 2), ("a", "b", "c"))]
]


@settings(max_examples=200, deadline=None)
@given(mesh=st.sampled_from(MESHES), rank=st.integers(1, 3), data=st.data())
def test_in_mesh_order_every_spec_round_trips(mesh, rank, data):
    """Each mesh axis to a dim or to none, in mesh order: spec -> placements -> the same spec."""
    dims = data.draw(st.lists(st.integers(-1, rank - 1), min_size=mesh.ndim, max_size=mesh.ndim))
    entries = []
    for d in range(rank):
        axes = tuple(mesh.axis_names[a] for a in range(mesh.ndim) if dims[a] == d)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    spec = P(*entries)
    placements = placements_from_spec(spec, mesh, rank)
    assert spec_from_placements(placements, mesh, rank).padded(rank) == spec.padded(rank)
