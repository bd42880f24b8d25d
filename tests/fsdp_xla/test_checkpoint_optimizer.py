"""Optimizer state in a checkpoint: factored state (Adafactor) and tensor hyperparameters load
back as they were saved; edited hyperparameters or state are refused before the model or the
optimizer changes. Host tensors: no XLA runtime needed."""

import copy
import json

import pytest
import torch

import fsdp_xla.checkpoint as ck
from fsdp_xla import CheckpointError


def trained(seed, opt_cls=torch.optim.Adam, **kw):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    opt = opt_cls(m.parameters(), **(kw or {"lr": 1e-3}))
    m(torch.randn(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    return m, opt


def same(a, b):
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def edit_index(version, change):
    meta = json.loads((version / "index.json").read_text())
    change(meta)
    (version / "index.json").write_text(json.dumps(meta))


def set_group(key, value):
    return lambda meta: meta["optimizer"]["param_groups"][0].__setitem__(key, value)


def scalar_step(value):
    def change(meta):
        meta["tensors"] = {k: v for k, v in meta["tensors"].items() if not k.endswith("/step")}
        meta["optimizer"]["scalars"] = {"0.weight": {"step": value}}

    return change


def alias_to_optimizer_state(meta):
    del meta["tensors"]["model/2.weight"]
    meta["aliases"] = {"model/2.weight": "optim/2.weight/exp_avg"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (set_group("lr", "abc"), "group 0 has lr='abc', not a number; this optimizer has lr=0.001"),
        (set_group("lr", float("nan")), "group 0 has lr=nan, not a finite number"),
        (set_group("betas", "xy"), "group 0 has betas='xy', not a list of 2"),
        (set_group("amsgrad", 1), "group 0 has amsgrad=1, not a bool"),
        (scalar_step([1, 2]), r"state 'step' of '0.weight' is \[1, 2\] in the checkpoint; it must be a number >= 0"),
        (scalar_step("x"), "state 'step' of '0.weight' is 'x'"),
        (alias_to_optimizer_state, "an alias names a model/ tensor"),
    ],
)
def test_an_edited_optimizer_entry_is_refused_and_changes_nothing(tmp_path, change, message):
    m, opt = trained(0)
    edit_index(ck.save_sharded(tmp_path / "ck", m, opt), change)
    target, target_opt = trained(1)
    before = copy.deepcopy((target.state_dict(), target_opt.state_dict()))
    with pytest.raises(CheckpointError, match=message):
        ck.load_sharded(tmp_path / "ck", target, target_opt)
    assert same(before, (target.state_dict(), target_opt.state_dict()))


def test_factored_state_of_adafactor_loads_back(tmp_path):
    m, opt = trained(0, torch.optim.Adafactor, lr=1e-2)
    assert opt.state[m[0].weight]["row_var"].shape == (8, 1)  # not the parameter's shape
    ck.save_sharded(tmp_path / "ck", m, opt)
    target, target_opt = trained(1, torch.optim.Adafactor, lr=1e-2)
    ck.load_sharded(tmp_path / "ck", target, target_opt)
    assert same(opt.state_dict(), target_opt.state_dict())
    for net, o in ((m, opt), (target, target_opt)):  # and training goes on identically
        net(torch.ones(2, 8)).sum().backward()
        o.step()
    assert same(m.state_dict(), target.state_dict())


def test_a_tensor_learning_rate_is_saved_and_loads_back_as_a_tensor(tmp_path):
    m, opt = trained(0, lr=torch.tensor(0.25))
    ck.save_sharded(tmp_path / "ck", m, opt)
    target, target_opt = trained(1, lr=torch.tensor(0.5))
    ck.load_sharded(tmp_path / "ck", target, target_opt)
    lr = target_opt.param_groups[0]["lr"]
    assert torch.is_tensor(lr) and lr.item() == 0.25
    plain, plain_opt = trained(1, lr=0.5)
    ck.load_sharded(tmp_path / "ck", plain, plain_opt)
    assert plain_opt.param_groups[0]["lr"] == 0.25
