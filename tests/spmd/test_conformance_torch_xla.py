"""Our HLO sharding text equals the one torch_xla's own mark_sharding produces, for every spec."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd import P, hlo_sharding_for, mark_sharding
from spmd._backend import torch_xla_backend
from tests.spmd.specs import MESH_SHAPES, all_specs, make_mesh

SHAPES = {1: (8,), 2: (8, 16), 3: (8, 4, 8)}


def torch_xla_text(mesh, spec, rank, device):
    import torch_xla.distributed.spmd as xs

    xmesh = xs.Mesh(mesh.device_ids, mesh.mesh_shape, mesh.axis_names)
    t = torch.zeros(SHAPES[rank]).to(device)
    xs.mark_sharding(t, xmesh, spec)
    return torch_xla_backend.sharding_text(t)


@pytest.mark.parametrize("shape", MESH_SHAPES)
@pytest.mark.parametrize("permuted", [False, True])
def test_every_spec_matches_torch_xla(xla, shape, permuted):
    mesh = make_mesh(shape, permuted)
    for rank in (1, 2, 3):
        for by_index in (False, True):
            for spec in all_specs(len(shape), rank, by_index=by_index):
                ours = str(hlo_sharding_for(mesh, P(*spec), rank))
                assert ours == torch_xla_text(mesh, spec, rank, xla), (mesh, spec)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_mark_sharding_attaches_the_same_sharding_as_torch_xla(xla, data):
    shape = data.draw(st.sampled_from(MESH_SHAPES))
    mesh = make_mesh(shape, data.draw(st.booleans()))
    rank = data.draw(st.integers(1, 3))
    spec = data.draw(st.sampled_from(list(all_specs(len(shape), rank))))
    t = torch.zeros(SHAPES[rank]).to(xla)
    mark_sharding(t, mesh, P(*spec))
    assert torch_xla_backend.sharding_text(t) == torch_xla_text(mesh, spec, rank, xla)
