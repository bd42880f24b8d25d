"""`mesh.ParallelDims` and the role rules: degrees checked once, meshes and axis sets derived, and
no role name written as a literal anywhere else in the product."""

import ast
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh import Mesh, MeshError, MeshTypeError, ParallelDims, Role
from mesh.roles import batch_axes, param_shard_axes, replicate_axes, sequence_axes, tensor_axes

ROOT = Path(__file__).resolve().parents[2]
degrees = st.integers(min_value=1, max_value=4)


@given(data=degrees, fsdp=degrees, context=degrees, tensor=degrees)
def test_the_mesh_round_trips_and_every_device_is_in_one_place(data, fsdp, context, tensor):
    dims = ParallelDims(data=data, fsdp=fsdp, context=context, tensor=tensor)
    mesh = dims.mesh()
    assert mesh.size() == dims.world == data * fsdp * context * tensor
    assert ParallelDims.from_mesh(mesh) == dims
    assert sorted(mesh.device_ids.tolist()) == list(range(dims.world))
    # Every derived axis set is a subsequence of the mesh's axes, and the sets partition the mesh's roles.
    names = mesh.axis_names
    derived = dims.batch_axes + dims.sequence_axes + tensor_axes(names)
    assert sorted(derived) == sorted(names)
    assert set(dims.param_shard_axes) | set(dims.replicate_axes) | set(tensor_axes(names)) == set(names)


@given(world_factor=degrees, data=degrees, context=degrees, tensor=degrees)
def test_for_world_gives_fsdp_what_the_others_leave(world_factor, data, context, tensor):
    world = world_factor * data * context * tensor
    dims = ParallelDims.for_world(world, data=data, context=context, tensor=tensor)
    assert dims.fsdp == world_factor and dims.world == world


def test_axes_of_degree_one_are_left_out_and_the_order_is_the_roles():
    assert ParallelDims().axis_names == ("fsdp",)
    assert ParallelDims(tensor=2, data=2).axis_names == ("data", "tensor")
    dims = ParallelDims(data=2, fsdp=2, context=2, tensor=2)
    assert dims.axis_names == tuple(Role) == ("data", "fsdp", "context", "tensor")
    assert (dims.batch_axes, dims.sequence_axes, dims.param_shard_axes, dims.replicate_axes) == (
        ("data", "fsdp"),
        ("context",),
        ("fsdp", "context"),
        ("data",),
    )


def test_axis_rules_read_any_mesh_s_names():
    names = ("data", "model", "context")
    assert batch_axes(names) == ("data",) and sequence_axes(names) == ("context",)
    assert param_shard_axes(names) == ("context",) and replicate_axes(names) == ("data",)
    assert batch_axes(None) == () and tensor_axes(("tensor", "fsdp")) == ("tensor",)


def test_a_role_member_names_a_mesh_axis_as_plain_text():
    mesh = Mesh(np.arange(4), (2, 2), (Role.DATA, Role.CONTEXT))
    assert mesh.axis_names == ("data", "context") and all(type(n) is str for n in mesh.axis_names)


@pytest.mark.parametrize(
    "build, error, said",
    [
        (lambda: ParallelDims(fsdp=0), MeshError, r"ParallelDims fsdp=0: a degree is the number of devices"),
        (lambda: ParallelDims(context=2.0), MeshTypeError, r"ParallelDims context must be an int"),
        (lambda: ParallelDims(tensor=True), MeshTypeError, r"ParallelDims tensor must be an int"),
        (lambda: ParallelDims.for_world(6, context=4), MeshError, r"6 devices do not divide into .* context 4"),
        (lambda: ParallelDims.from_mesh(Mesh(np.arange(4), (2, 2), ("data", "model"))), MeshError, r"axes \['model'\]"),
        (lambda: ParallelDims.from_mesh(Mesh(np.arange(4), (4,))), MeshError, r"the mesh is not"),
        (lambda: ParallelDims(fsdp=2).mesh(np.arange(3)), MeshError, r"mesh_shape \(2,\) holds 2 devices but 3"),
    ],
)
def test_bad_degrees_and_meshes_are_refused_with_the_fix(build, error, said):
    with pytest.raises(error, match=said):
        build()


def _role_literals(path: Path) -> list[str]:
    """``file:line 'role'`` for each string constant in ``path`` that is exactly a role's name."""
    roles = {str(r) for r in Role}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in roles:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    return found


def test_no_role_name_is_written_outside_its_owner():
    """Role names come from `mesh.Role` / `ParallelDims`; a literal elsewhere is a rule of its own."""
    owner = ROOT / "mesh" / "roles.py"
    files = [p for package in ("mesh", "spmd", "fsdp_xla") for p in sorted((ROOT / package).rglob("*.py"))]
    literals = [hit for p in files if p != owner for hit in _role_literals(p)]
    assert literals == [], "\n".join(literals)
