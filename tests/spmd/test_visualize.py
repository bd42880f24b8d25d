import io

import numpy as np
import pytest
import torch
from rich.console import Console

from mesh import Mesh
from spmd import NamedSharding, P, SpmdTypeError, mark_sharding, visualize_sharding
from spmd.visualize import sharding_layout

MESH = Mesh(np.arange(8), (4, 2), ("data", "model"))


def render(*args, **kw):
    buf = io.StringIO()
    visualize_sharding(*args, console=Console(file=buf, width=200), **kw)
    return buf.getvalue()


def test_2d_grid_without_devices():
    out = render(torch.empty(8, 4, device="meta"), NamedSharding(MESH, P("data", "model")))
    assert "[0:2, 0:2]" in out and "dev 0" in out and "[6:8, 2:4]" in out and "dev 7" in out


def test_layout_groups_replicas():
    s = NamedSharding(MESH, P(None, "model"))
    layout = sharding_layout((8, 4), s.shard_bounds((8, 4)))
    assert layout.cells == ((("0:8", "0:2", (0, 2, 4, 6)), ("0:8", "2:4", (1, 3, 5, 7))),)


def test_3d_lists_blocks():
    s = NamedSharding(Mesh(np.arange(8), (2, 2, 2), ("x", "y", "z")), P("x", "y", "z"))
    layout = sharding_layout((4, 4, 4), s.shard_bounds((4, 4, 4)))
    assert len(layout.cells) == 8 and layout.cells[0][0] == ("0:2, 0:2, 0:2", "", (0,))


def test_sharded_tensor(xla):
    view = mark_sharding(torch.zeros(8).to(xla), MESH, P("data"))
    out = render(view)
    assert "[0:2]" in out and "dev 0, 1" in out


def test_needs_a_sharding():
    with pytest.raises(TypeError, match="sharding=NamedSharding"):
        visualize_sharding(torch.zeros(2))


@pytest.mark.parametrize(
    "tensor, sharding, console, match",
    [
        ("x", NamedSharding(MESH, P("data")), None, r"draws a tensor \(anything with a .shape of ints\), got 'x'"),
        (torch.zeros(8, 4), P("data"), None, r"got PartitionSpec; write NamedSharding\(mesh, P\('data'\)\)"),
        (torch.zeros(8, 4), NamedSharding(MESH, P("data")), "x", "console is a rich.console.Console or None, got 'x'"),
    ],
)
def test_arguments_of_the_wrong_type_are_named(tensor, sharding, console, match):
    with pytest.raises(SpmdTypeError, match=match):
        visualize_sharding(tensor, sharding, console=console)
