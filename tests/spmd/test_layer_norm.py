"""ShardableLayerNorm: equal to F.layer_norm, and kept batch-sharded by GSPMD where torch_xla's
own LayerNorm all-gathers the activation (read from the partitioned HLO)."""

import re

import numpy as np
import pytest
import torch

from mesh import Mesh
from spmd import P, ShardableLayerNorm, layer_norm, mark_sharding, use_shardable_layer_norm
from spmd.errors import SpmdTypeError
from spmd.inspector import CollectiveKind, capture
from spmd.layer_norm import LayerNormError, LayerNormShapeError


def test_equal_to_torch_layer_norm_with_gradients():
    torch.manual_seed(0)
    x = torch.randn(4, 6, 32, requires_grad=True)
    w, b = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)
    ours = layer_norm(x, (32,), w, b, 1e-5)
    ref = torch.nn.functional.layer_norm(x, (32,), w, b, 1e-5)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    g_ours = torch.autograd.grad(ours.square().sum(), (x, w, b))
    g_ref = torch.autograd.grad(ref.square().sum(), (x, w, b))
    for a, r in zip(g_ours, g_ref):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4)
    half = layer_norm(x.detach().bfloat16(), (32,))
    assert half.dtype == torch.bfloat16


def test_use_shardable_layer_norm_swaps_exact_layer_norms_only():
    class Custom(torch.nn.LayerNorm):
        pass

    model = torch.nn.Sequential(torch.nn.LayerNorm(8), Custom(8), torch.nn.Linear(8, 8))
    state = model.state_dict()
    assert use_shardable_layer_norm(model) == 1
    assert type(model[0]) is ShardableLayerNorm and type(model[1]) is Custom
    assert model.state_dict().keys() == state.keys()


def test_an_int_normalized_shape_is_one_dim_as_nn_layer_norm_takes_it():
    x = torch.randn(4, 8)
    torch.testing.assert_close(layer_norm(x, 8), torch.nn.functional.layer_norm(x, (8,)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (
            ((5,),),
            {},
            LayerNormShapeError,
            r"normalized_shape \(5,\) must be the trailing dims of the input of shape \(4, 8\)",
        ),
        (((),), {}, LayerNormShapeError, "got no dims"),
        (((4, 8, 2),), {}, LayerNormShapeError, r"\(4, 8, 2\) must be the trailing dims"),
        (
            ((8,),),
            {"weight": torch.ones(3)},
            LayerNormShapeError,
            r"weight must have shape normalized_shape \(8,\), got \(3,\)",
        ),
        (((8,),), {"bias": 5}, SpmdTypeError, "bias is a tensor"),
        ((("8",),), {}, SpmdTypeError, "normalized_shape is an int or a tuple of ints"),
    ],
)
def test_shapes_that_do_not_fit_the_input_are_refused(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        layer_norm(torch.randn(4, 8), *args, **kwargs)


def test_use_shardable_layer_norm_needs_a_module():
    with pytest.raises(SpmdTypeError, match="needs an nn.Module, got 5"):
        use_shardable_layer_norm(5)


def collectives_of_layer_norm(xla, module):
    import torch_xla

    mesh = Mesh(np.arange(8), (8,), ("data",))
    module = module.to(xla)
    x = torch.randn(16, 32, 64).to(xla)
    mark_sharding(x, mesh, P("data"))
    with capture() as report:
        y = module(x)
        torch_xla.sync()
    assert y.shape == x.shape
    return report.graphs[-1].collectives


def test_torch_xla_layer_norm_gathers_the_batch_ours_does_not(xla):
    native = collectives_of_layer_norm(xla, torch.nn.LayerNorm(64))
    assert [c.kind for c in native] == [CollectiveKind.ALL_GATHER]
    assert native[0].shape == "f32[1,512,64]"  # all 16 x 32 rows on every device
    assert collectives_of_layer_norm(xla, ShardableLayerNorm(64)) == ()


@pytest.mark.parametrize(
    "kwargs, error, said",
    [
        (dict(normalized_shape=0), LayerNormError, "has a size below 1"),
        (dict(normalized_shape=(8, -1)), LayerNormError, "has a size below 1"),
        (dict(normalized_shape=()), SpmdTypeError, "a non-empty tuple of ints, got ()"),
        (dict(normalized_shape="8"), SpmdTypeError, "normalized_shape is an int or a non-empty tuple of ints, got '8'"),
        (dict(normalized_shape=True), SpmdTypeError, "normalized_shape is an int"),
        (dict(normalized_shape=8, eps=float("nan")), LayerNormError, "eps must be finite and >= 0, got nan"),
        (dict(normalized_shape=8, eps=-1.0), LayerNormError, "eps must be finite and >= 0, got -1.0"),
        (dict(normalized_shape=8, eps=None), SpmdTypeError, "eps must be a real number, got None"),
        (dict(normalized_shape=8, elementwise_affine="no"), SpmdTypeError, "elementwise_affine must be True or False"),
        (dict(normalized_shape=8, bias=None), SpmdTypeError, "bias must be True or False, got None"),
    ],
)
def test_shardable_layer_norm_checks_its_arguments(kwargs, error, said):
    """torch's LayerNorm took 'no' as True, eps=None until the first forward (a TypeError inside
    it), a NaN eps as NaN outputs, 0 as an empty norm and -1 as a RuntimeError from torch.empty."""
    with pytest.raises(error, match=re.escape(said)):
        ShardableLayerNorm(**kwargs)


@pytest.mark.parametrize(
    "eps, error",
    [(float("nan"), LayerNormError), (-1e-5, LayerNormError), ("1e-5", SpmdTypeError), (True, SpmdTypeError)],
)
def test_layer_norm_checks_eps(eps, error):
    """A NaN or negative eps gave NaN outputs; a string a TypeError from inside the arithmetic."""
    with pytest.raises(error, match="layer_norm: eps must be"):
        layer_norm(torch.zeros(4, 8), 8, eps=eps)
