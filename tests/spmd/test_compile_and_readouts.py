"""No false readouts and no needless retraces on torch_xla: a traced value's layout reads as not
assigned yet (pytorch/xla#7846), values our API places on the devices carry an explicit layout so
torch.compile's openxla bridge traces once (pytorch/xla#9755), and a sharded view compiles."""

import numpy as np
import pytest
import torch

import spmd
from mesh import Mesh
from spmd import P, get_sharding, mark_sharding

MESH = Mesh(np.arange(8), (8,), ("data",))


def test_an_intermediates_layout_reads_as_not_assigned_until_it_is_computed(xla, capsys):
    import torch_xla

    x = mark_sharding(torch.ones(8, 4).to(xla), MESH, P("data"))
    y = x * 2  # traced, not computed: the compiler decides its layout
    assert y.sharding_spec == "" and y.hlo_sharding is None and get_sharding(y) is None
    assert spmd.visualize_sharding(y) is None
    assert "not assigned yet (the compiler decides)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="layout is not assigned yet"):
        _ = y.shard_bounds
    torch_xla.sync()
    assert y.hlo_sharding is not None  # computed: the layout it got is known


def test_inputs_our_api_places_do_not_make_the_openxla_bridge_retrace(xla):
    import torch_xla
    import torch_xla._dynamo.dynamo_bridge as bridge

    traces = []
    original = bridge.extract_graph_helper

    def counting(*args, **kwargs):
        traces.append(1)
        return original(*args, **kwargs)

    w = spmd.distribute_tensor(torch.randn(16, 16), MESH, P())
    compiled = torch.compile(lambda x, w: (x @ w).relu(), backend="openxla")
    bridge.extract_graph_helper = counting
    try:
        for _ in range(4):
            x = spmd.distribute_tensor(torch.randn(8, 16), MESH, P())  # replicated, and says so
            out = compiled(x, w)
            torch_xla.sync()
    finally:
        bridge.extract_graph_helper = original
    # A tensor sent with .to(device) holds no layout ('') until it runs, then {replicated}: the
    # bridge saw a change and traced again on every step (pytorch/xla#9755, 4 traces in 4 steps).
    assert len(traces) == 1
    torch.testing.assert_close(out.cpu(), (x.cpu() @ w.cpu()).relu())


def test_a_sharded_view_compiles(xla):
    import torch_xla

    x = mark_sharding(torch.randn(8, 4).to(xla), MESH, P("data"))
    compiled = torch.compile(lambda a: (a * 2).relu(), backend="openxla")
    out = compiled(x)
    torch_xla.sync()
    torch.testing.assert_close(out.cpu(), (x.cpu() * 2).relu())
