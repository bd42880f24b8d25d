"""A wrap that fails part way, where no check could see it coming (the user's init raising on the
third unit), leaves the model as it was: every module's class, every parameter's identity,
device, sharding and bytes; and a retry wraps it (fsdp_xla._rollback)."""

import numpy as np
import pytest
import torch

from fsdp_xla import FSDP, deferred_init, transformer_auto_wrap_policy
from spmd import get_sharding
from tests.fsdp_xla.helpers import GPT, SMALL, Block, fsdp_mesh


class InitFailed(RuntimeError):
    pass


def failing_on_call(n):
    """An init that works, then raises on its ``n``-th call (the units before it are sharded by then)."""
    calls = []

    def init(module):
        calls.append(type(module).__name__)
        if len(calls) == n:
            raise InitFailed(f"init call {n} ({type(module).__name__})")
        for p in module.parameters(recurse=False):
            torch.nn.init.normal_(p, std=0.02)

    return init, calls


def snapshot(model):
    """Each module's class and attribute names; each tensor's identity, device, sharding and bytes."""
    modules = {name: (type(m), sorted(vars(m))) for name, m in model.named_modules()}
    tensors = {
        name: (id(t), t.device.type, t.is_meta, str(get_sharding(t)) if t.device.type == "xla" else None)
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    }
    data = {name: t.detach().cpu().clone() for name, t in model.named_buffers()}
    return modules, tensors, data


def same(a, b):
    return a[:2] == b[:2] and a[2].keys() == b[2].keys() and all(torch.equal(a[2][k], b[2][k]) for k in a[2])


def test_an_init_raising_on_a_later_unit_leaves_the_deferred_model_as_it_was(xla):
    model = deferred_init(GPT, **SMALL)
    before = snapshot(model)
    init, calls = failing_on_call(12)  # GPT's modules in unit order: the root's, then h.0's, ...
    with pytest.raises(InitFailed):
        FSDP(model, mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}), param_init_fn=init)
    assert len(calls) == 12 and same(snapshot(model), before)
    assert all(p.is_meta for p in model.parameters())  # nothing materialized stays
    FSDP(model, mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    assert model.fsdp_units == ["", "h.0", "h.1", "h.2"] and not any(p.is_meta for p in model.parameters())


def test_a_failure_after_units_were_sharded_puts_real_parameters_back_bytewise(xla, monkeypatch):
    """Units of a real (not deferred) model are sharded onto the device one by one; a failure in
    the third puts every parameter back where it was (host), same object, same bytes."""
    import fsdp_xla._gspmd as gspmd

    model = GPT(**SMALL)
    params = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    before = snapshot(model)
    real, placed = gspmd._place_buffers, []

    def place_buffers(plan, precision):  # the library's own step, failing on the third unit
        placed.append(plan.path)
        if len(placed) == 3:
            raise MemoryError("device memory ran out")
        real(plan, precision)

    monkeypatch.setattr(gspmd, "_place_buffers", place_buffers)
    with pytest.raises(MemoryError):
        FSDP(model, mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    assert same(snapshot(model), before)
    for name, p in model.named_parameters():
        assert p is params[name][0] and p.device.type == "cpu" and torch.equal(p.detach(), params[name][1]), name
    monkeypatch.undo()
    FSDP(model, mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    assert np.allclose(model.wte.weight.cpu().detach().numpy(), params["wte.weight"][1].numpy())
