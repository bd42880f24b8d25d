"""torch_xla's submodules under our names: debugging's tables equal torch_xla's, and the
xla_sharded_tensor / api / xla_sharding names a migrated import asks for are there."""

import numpy as np
import pytest
import torch

from spmd import Mesh, SpmdTypeError, mark_sharding


def test_visualize_tensor_sharding_prints_what_torch_xla_prints(xla, capsys):
    import torch_xla.distributed.spmd as xs
    import torch_xla.distributed.spmd.debugging as theirs

    from spmd import debugging

    t = mark_sharding(torch.zeros(8, 8).to(xla), Mesh(np.arange(8), (4, 2), ("data", "model")), ("data", "model"))
    debugging.visualize_tensor_sharding(t, use_color=False)
    ours = capsys.readouterr().out
    u = torch.zeros(8, 8).to(xla)
    xs.mark_sharding(u, xs.Mesh(np.arange(8), (4, 2), ("data", "model")), ("data", "model"))
    theirs.visualize_tensor_sharding(u, use_color=False)
    assert ours == capsys.readouterr().out and "Visualizing {devices=[4,2]0,1,2,3,4,5,6,7}" in ours
    with pytest.raises(SpmdTypeError, match=r"shape \(2,\) carries no sharding"):
        debugging.visualize_tensor_sharding(torch.zeros(2).to(xla))


def test_visualize_sharding_parses_the_text_first(xla, capsys):
    from spmd import HloShardingError, debugging

    with pytest.raises(HloShardingError, match="Not an HLO sharding this parser knows: 'garbage'"):
        debugging.visualize_sharding("garbage")
    debugging.visualize_sharding("{devices=[2,4]<=[8]}", use_color=False)  # the iota form JAX prints
    assert "Visualizing {devices=[2,4]0,1,2,3,4,5,6,7}" in capsys.readouterr().out


def test_torch_xla_submodule_names_are_here():
    """torch_xla's submodule paths import from spmd.compat, whose helpers are ours."""
    import spmd.api
    import spmd.compat
    from spmd.api import convert_to_xla_mesh, xla_distribute_tensor
    from spmd.xla_sharded_tensor import XLAShard, XLAShardedTensor
    from spmd.xla_sharding import Mesh, PartitionSpec

    assert XLAShardedTensor is spmd.XLAShardedTensor and XLAShard is spmd.XLAShard
    assert PartitionSpec is spmd.PartitionSpec and Mesh is spmd.Mesh
    assert xla_distribute_tensor is spmd.xla_distribute_tensor is spmd.compat.api.xla_distribute_tensor
    assert spmd.api is spmd.compat.api and spmd.debugging is spmd.compat.debugging
    assert convert_to_xla_mesh.__module__ == "spmd.compat.api"
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        spmd.api.nothing  # noqa: B018
