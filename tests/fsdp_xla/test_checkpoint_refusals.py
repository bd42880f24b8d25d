"""A checkpoint that does not match the model or optimizer it is loaded into is refused with
`CheckpointError` naming what differs, and leaves every parameter (bytes, identity, device) and
every optimizer state as it was: another model's LATEST, a missing key, another shape, another
dtype, another optimizer class. Host tensors here; the XLA-sharded case below."""

import pytest
import torch

import fsdp_xla.checkpoint as ck
from fsdp_xla import CheckpointError
from tests.fsdp_xla.helpers import GPT, SMALL


def trained(optimizer=torch.optim.AdamW, dtype=torch.float32, seed=0, **sizes):
    """A model and its optimizer after one step (so the optimizer holds state)."""
    torch.manual_seed(seed)
    model = GPT(**{**SMALL, **sizes}).to(dtype)
    opt = optimizer(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, SMALL["vocab"], (2, 9))
    model(tokens[:, :-1]).float().sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def state(model, opt):
    """Every parameter's identity, device and bytes; every optimizer state and hyperparameter."""
    params = {n: (id(p), p.device, p.dtype, p.detach().cpu().clone()) for n, p in model.named_parameters()}
    saved = opt.state_dict()
    optim = {
        (i, f): v.detach().cpu().clone() if torch.is_tensor(v) else v
        for i, s in saved["state"].items()
        for f, v in s.items()
    }
    groups = [{k: v for k, v in g.items()} for g in saved["param_groups"]]
    return params, optim, groups


def same_bytes(x, y):
    return (
        x.dtype == y.dtype
        and x.shape == y.shape
        and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
    )


def assert_same(a, b):
    assert a[0].keys() == b[0].keys() and a[1].keys() == b[1].keys() and a[2] == b[2]
    for n in a[0]:
        assert a[0][n][:3] == b[0][n][:3] and same_bytes(a[0][n][3], b[0][n][3]), n
    for k in a[1]:
        x, y = a[1][k], b[1][k]
        assert same_bytes(x, y) if torch.is_tensor(x) else x == y, k


CASES = [
    ("another model's LATEST", dict(n_layer=2), {}, r"does not match the model: missing \[\], unexpected \['h\.2\."),
    ("another width", dict(d_model=32), {}, r"'wte.weight' has shape \(64, 64\) in the checkpoint but \(64, 32\)"),
    (
        "another dtype",
        dict(dtype=torch.bfloat16),
        {},
        r"'wte.weight' is float32 in the checkpoint but bfloat16 in the model, which cannot hold it exactly",
    ),
    (
        "another optimizer",
        dict(optimizer=torch.optim.SGD),
        {},
        r"optimizer is 'torch.optim.adamw.AdamW', this one is 'torch.optim.sgd.SGD'",
    ),
    ("a missing key", {}, dict(drop="model/h.1.c_fc.bias"), r"missing \['h.1.c_fc.bias'\]"),
]


@pytest.mark.parametrize(("what", "build", "damage", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_checkpoint_unlike_the_model_is_refused_and_changes_nothing(tmp_path, what, build, damage, message):
    saved_model, saved_opt = trained(seed=1)
    version = ck.save_sharded(tmp_path, saved_model, saved_opt)
    if "drop" in damage:  # as if saved from a model without that tensor
        import json

        meta = json.loads((version / "index.json").read_text())
        del meta["tensors"][damage["drop"]]
        (version / "index.json").write_text(json.dumps(meta))
    model, opt = trained(seed=2, **build)
    before = state(model, opt)
    with pytest.raises(CheckpointError, match=message):
        ck.load_sharded(tmp_path, model, opt)
    assert_same(state(model, opt), before)


def test_the_matching_model_still_loads(tmp_path):
    saved_model, saved_opt = trained(seed=1)
    ck.save_sharded(tmp_path, saved_model, saved_opt)
    model, opt = trained(seed=2)
    ck.load_sharded(tmp_path, model, opt)
    for (n, p), q in zip(model.named_parameters(), saved_model.parameters()):
        assert same_bytes(p.detach(), q.detach()), n
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], saved_opt.state_dict()["state"][0]["exp_avg"])


def test_a_widening_dtype_loads_exactly(tmp_path):
    # a bf16 checkpoint into an fp32 model: every value fits, so it loads (a narrowing one is refused above)
    saved_model, saved_opt = trained(seed=1, dtype=torch.bfloat16)
    ck.save_sharded(tmp_path, saved_model)
    model, _ = trained(seed=2)
    ck.load_sharded(tmp_path, model)
    for (n, p), q in zip(model.named_parameters(), saved_model.parameters()):
        assert p.dtype == torch.float32 and torch.equal(p.detach(), q.detach().float()), n


def test_a_checkpoint_from_before_the_optimizer_class_was_recorded_still_loads(tmp_path):
    import json

    saved_model, saved_opt = trained(seed=1)
    version = ck.save_sharded(tmp_path, saved_model, saved_opt)
    meta = json.loads((version / "index.json").read_text())
    del meta["optimizer"]["class"]
    (version / "index.json").write_text(json.dumps(meta))
    model, opt = trained(seed=2)
    ck.load_sharded(tmp_path, model, opt)
    assert torch.equal(model.wte.weight, saved_model.wte.weight)


@pytest.mark.parametrize(("what", "build", "damage", "message"), CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_a_sharded_xla_model_refuses_the_same_and_stays_sharded(xla, tmp_path, what, build, damage, message):
    from fsdp_xla import FSDP, transformer_auto_wrap_policy
    from spmd import get_sharding
    from tests.fsdp_xla.helpers import Block, fsdp_mesh

    saved_model, saved_opt = trained(seed=1)
    ck.save_sharded(tmp_path, saved_model, saved_opt)
    torch.manual_seed(2)
    model = GPT(**{**SMALL, **{k: v for k, v in build.items() if k in ("n_layer", "d_model")}})
    if "dtype" in build:
        model = model.to(build["dtype"])
    FSDP(model, mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    opt = build.get("optimizer", torch.optim.AdamW)(model.parameters(), lr=1e-3)
    shardings = {n: str(get_sharding(p)) for n, p in model.named_parameters()}
    before = state(model, opt)
    with pytest.raises(CheckpointError, match=message):
        ck.load_sharded(tmp_path, model, opt)
    assert_same(state(model, opt), before)
    assert {n: str(get_sharding(p)) for n, p in model.named_parameters()} == shardings
