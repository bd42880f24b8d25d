"""torch_xla's submodules under our names: debugging's tables equal torch_xla's, and the
xla_sharded_tensor / api / xla_sharding names a migrated import asks for are there."""

import numpy as np
import pytest
import torch

import spmd
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


@pytest.mark.torch_xla
def test_torch_xla_submodule_names_are_here():
    import torch_xla.distributed.spmd as xs

    from spmd.api import xla_distribute_tensor
    from spmd.xla_sharded_tensor import XLAShard, XLAShardedTensor
    from spmd.xla_sharding import PartitionSpec

    assert XLAShardedTensor is spmd.XLAShardedTensor and XLAShard is spmd.XLAShard
    assert PartitionSpec is spmd.PartitionSpec
    assert xla_distribute_tensor is xs.xla_distribute_tensor
    assert spmd.api.auto_policy is xs.auto_policy and spmd.debugging and spmd.xla_sharded_tensor
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        spmd.api.nothing  # noqa: B018
