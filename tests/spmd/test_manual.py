"""Manual sharding regions: blocks in, blocks out, numerics equal to the unsharded computation."""

import numpy as np
import pytest
import torch

from mesh import Mesh, set_global_mesh
from spmd import (
    P,
    ShardingConflictError,
    ShardingError,
    ShardingType,
    SpmdTypeError,
    disable_manual_sharding,
    enable_manual_sharding,
    mark_manual_sharding,
    mark_sharding,
)

MESH = Mesh(np.arange(8), (2, 4), ("data", "model"))


def test_round_trip_equals_unsharded(xla):
    x = torch.arange(8 * 12, dtype=torch.float32).reshape(8, 12)
    block = enable_manual_sharding(x.to(xla), ("data", "model"), mesh=MESH)
    assert block.shape == (4, 3) and block.sharding_type is ShardingType.MANUAL
    out = disable_manual_sharding(block * 2 + 1, ("data", "model"), x.shape, mesh=MESH)
    assert out.shape == (8, 12) and out.sharding_spec == "{devices=[2,4]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(out.cpu(), x * 2 + 1)


def test_global_mesh_and_torch_xla_call_form(xla):
    set_global_mesh(MESH)
    x = torch.zeros(8, 8).to(xla)
    xx = enable_manual_sharding(x, (None, "model"))
    assert xx.shape == (8, 2)
    xxx = disable_manual_sharding(xx + 1, (None, "model"), x.shape)
    torch.testing.assert_close(xxx.cpu(), torch.ones(8, 8))


def test_mark_sharding_inside_a_manual_region_says_what_to_do(xla):
    block = enable_manual_sharding(torch.zeros(8, 8).to(xla), ("data", None), mesh=MESH)
    inner = block + 1
    mark_manual_sharding(inner)
    with pytest.raises(ShardingConflictError, match=r"manually sharded .*Call disable_manual_sharding"):
        mark_sharding(inner, MESH, ("data", None))


def test_errors(xla):
    block = enable_manual_sharding(torch.zeros(8, 8).to(xla), ("data", None), mesh=MESH)
    with pytest.raises(ShardingError, match=r"block of shape \(4, 8\) does not come from full_shape \(8, 4\)"):
        disable_manual_sharding(block + 1, ("data", None), (8, 4), mesh=MESH)
    with pytest.raises(RuntimeError, match="device data"):  # a ShardingConflictError, as torch_xla's type
        mark_manual_sharding(torch.zeros(3, 2).to(xla))


@pytest.mark.parametrize("full_shape", ["ab", (8, "4"), (8, -4), 8, (8, True)])
def test_disable_manual_sharding_names_a_full_shape_that_is_not_sizes(full_shape):
    with pytest.raises(SpmdTypeError, match="full_shape is the global shape, a tuple of sizes >= 0"):
        disable_manual_sharding(torch.zeros(4, 1), P("data"), full_shape, mesh=MESH)
