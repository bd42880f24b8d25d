"""Deferred init: no parameter memory at build time; FSDP initializes each unit into its
shards; the same seed gives the same weights for any mesh and wrap policy."""

import numpy as np
import pytest
import torch

from fsdp_xla import FSDP, DeferredInitError, deferred_init, transformer_auto_wrap_policy
from fsdp_xla.deferred import params_on_meta
from mesh import Mesh
from tests.fsdp_xla.helpers import GPT, SMALL, Block, batches, fsdp_mesh, train


def test_deferred_build_puts_parameters_on_meta_and_keeps_buffers():
    class WithBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.register_buffer("mask", torch.ones(3, 3).tril())

    model = deferred_init(WithBuffer)
    assert model.proj.weight.is_meta and model.proj.bias.is_meta
    assert not model.mask.is_meta and model.mask.sum().item() == 6
    gpt = deferred_init(GPT, **SMALL)
    assert all(p.is_meta for p in gpt.parameters())
    assert gpt.lm_head.weight is gpt.wte.weight
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"  # the patch is gone after the block
    with pytest.raises(TypeError, match="build_fn returned int"):
        deferred_init(lambda: 3)


def state_on_host(model):
    return {k: v.cpu() for k, v in model.state_dict().items()}


def test_same_seed_same_weights_for_any_mesh_and_policy(xla):
    one = FSDP(deferred_init(GPT, **SMALL), mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    two_d = Mesh(np.arange(8), (4, 2), ("fsdp", "model"))
    other = FSDP(deferred_init(GPT, **SMALL), mesh=two_d)  # no policy: one unit
    a, b = state_on_host(one), state_on_host(other)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    assert 0.01 < a["h.0.c_fc.weight"].std().item() < 0.03  # the model's own init (std 0.02) ran
    assert torch.count_nonzero(a["h.0.c_fc.bias"]) == 0
    assert torch.all(a["h.0.ln_1.weight"] == 1)  # LayerNorm.reset_parameters ran
    reseeded = state_on_host(FSDP(deferred_init(GPT, **SMALL), mesh=fsdp_mesh(), init_seed=1))
    assert not torch.equal(reseeded["h.0.c_fc.weight"], a["h.0.c_fc.weight"])


def test_deferred_model_trains(xla):
    model = FSDP(deferred_init(GPT, **SMALL), mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    assert model.lm_head.weight is model.wte.weight
    losses = train(model, batches(6), xla, fsdp_mesh(), lr=1e-2)
    assert losses[-1] < losses[0]


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        return x * self.gain


def test_modules_without_an_init_are_named(xla):
    with pytest.raises(
        DeferredInitError, match=r"Module '<root>' \(Scale\) holds parameters but has no reset_parameters"
    ):
        FSDP(deferred_init(Scale), mesh=fsdp_mesh())
    model = FSDP(deferred_init(Scale), mesh=fsdp_mesh(), param_init_fn=lambda m: torch.nn.init.ones_(m.gain))
    assert torch.all(model.gain.cpu() == 1)


def test_a_unit_without_an_init_is_refused_before_any_unit_is_materialized(xla):
    model = deferred_init(lambda: torch.nn.Sequential(torch.nn.Linear(8, 8), Scale()))
    with pytest.raises(DeferredInitError, match=r"Module '1' \(Scale\) holds parameters"):
        FSDP(model, mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Scale}))
    assert all(p.is_meta for p in model.parameters())  # the root unit (the Linear) was not materialized
    assert type(model) is torch.nn.Sequential
    FSDP(model, mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Scale}), param_init_fn=init_ones)
    assert torch.all(model[1].gain.cpu() == 1) and torch.all(model[0].weight.cpu() == 1)


def init_ones(module):
    for p in module.parameters(recurse=False):
        torch.nn.init.ones_(p)


@pytest.mark.parametrize("build_fn", [5, "GPT", None])
def test_deferred_init_takes_a_callable(build_fn):
    with pytest.raises(TypeError, match=r"deferred_init takes the model's class or a function that builds it"):
        deferred_init(build_fn)


def test_meta_buffers_need_deferred_init_or_an_init_fn(xla):
    with torch.device("meta"):
        model = torch.nn.BatchNorm1d(4)
    with pytest.raises(DeferredInitError, match=r"Buffer 'running_mean' \(4,\) is on the meta device"):
        FSDP(model, mesh=fsdp_mesh())


def test_params_on_meta_restores_register_parameter_on_error():
    original = torch.nn.Module.register_parameter
    with pytest.raises(RuntimeError, match="boom"):
        with params_on_meta():
            raise RuntimeError("boom")
    assert torch.nn.Module.register_parameter is original


def test_from_pretrained_is_refused_since_meta_would_discard_its_weights():
    from transformers import GPT2LMHeadModel

    from fsdp_xla import FSDPTypeError

    with pytest.raises(FSDPTypeError, match=r"from_pretrained.*weights are discarded.*FSDP\(Model.from_pretrained"):
        deferred_init(GPT2LMHeadModel.from_pretrained, "any/checkpoint")


def test_deferred_build_inside_a_fake_tensor_mode():
    """The inspector's dry run builds models under a fake tensor mode, where a parameter is the
    fake tensor itself (marked a parameter): deferred init builds it on meta all the same."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = deferred_init(torch.nn.Linear, 4, 4)
    assert model.weight.is_meta and isinstance(model.weight, torch.nn.Parameter) and model.weight.requires_grad
