"""Run under torchrun by test_refusals_dtensor.py: refusals leave things as they were on the
dtensor backend (gloo).

    torchrun --nproc_per_node 2 tests/workers/refusal_worker.py OUT_DIR

1. FSDP of a deferred model whose init raises on a later unit (units already given to torch's
   ``fully_shard``): the model comes back as it was (classes, meta parameters, no FSDP state),
   and a retry wraps it.
2. A sharded model and optimizer loading checkpoints unlike them (another model's LATEST,
   another dtype, another optimizer class): `CheckpointError` on every rank, every local block
   and optimizer state byte-identical, every parameter the same object on the same device.

Each rank writes rank<r>.json into OUT_DIR: {case: "ok" or what went wrong}.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import fsdp_xla.checkpoint as ck
from examples.train_fsdp import GPT, Block, rank_step, synthetic_batch
from fsdp_xla import FSDP, CheckpointError, deferred_init, transformer_auto_wrap_policy
from mesh import Mesh

SMALL = dict(vocab=64, d_model=64, n_head=4, n_layer=3, seq=16)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(sys.argv[1])
mesh = Mesh(np.arange(world), (world,), ("fsdp",))
policy = transformer_auto_wrap_policy({Block})
results = {}


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def snapshot(model, opt=None):
    classes = {n: type(m) for n, m in model.named_modules()}
    params = {n: (id(p), str(p.device), p.is_meta) for n, p in model.named_parameters()}
    data = {n: local(p).detach().clone() for n, p in model.named_parameters() if not p.is_meta}
    if opt is not None:
        for i, s in opt.state_dict()["state"].items():
            data.update({f"optim/{i}/{f}": local(v).detach().clone() for f, v in s.items() if torch.is_tensor(v)})
    return classes, params, data


def same(a, b):
    bytes_equal = a[2].keys() == b[2].keys() and all(
        a[2][k].dtype == b[2][k].dtype
        and torch.equal(a[2][k].reshape(-1).view(torch.uint8), b[2][k].reshape(-1).view(torch.uint8))
        for k in a[2]
    )
    return a[0] == b[0] and a[1] == b[1] and bytes_equal


def check(name, fn):
    try:
        fn()
        results[name] = "ok"
    except Exception as e:  # recorded, so that every case runs and the test shows each
        results[name] = f"{type(e).__name__}: {e}"[:800]


def wrap_rolls_back():
    model = deferred_init(GPT, **SMALL)
    before = snapshot(model)

    def init(module):
        if module is model.h[0].c_fc:  # inner units go first on this backend: h.2 and h.1 are sharded by then
            raise KeyError("init failed")
        for p in module.parameters(recurse=False):
            torch.nn.init.normal_(p, std=0.02)

    try:
        FSDP(model, mesh=mesh, auto_wrap_policy=policy, param_init_fn=init)
    except KeyError:
        pass
    else:
        raise AssertionError("the init's error did not come through")
    assert same(snapshot(model), before), "the model changed"
    FSDP(model, mesh=mesh, auto_wrap_policy=policy)  # a retry wraps it
    assert not any(p.is_meta for p in model.parameters())


def load_refused(build, message, optimizer=torch.optim.AdamW):
    def run():
        model = FSDP(build(), mesh=mesh, auto_wrap_policy=policy)
        opt = optimizer(model.parameters(), lr=1e-3)
        rank_step(model, opt, synthetic_batch(torch.Generator().manual_seed(3), 2 * world, 16, 64))
        before = snapshot(model, opt)
        try:
            ck.load_sharded(out / "ck", model, opt)
        except CheckpointError as e:
            assert message in str(e), str(e)
        else:
            raise AssertionError("loaded")
        assert same(snapshot(model, opt), before), "the model or optimizer changed"

    return run


torch.manual_seed(0)
saved = FSDP(GPT(**SMALL), mesh=mesh, auto_wrap_policy=policy)
saved_opt = torch.optim.AdamW(saved.parameters(), lr=1e-3)
rank_step(saved, saved_opt, synthetic_batch(torch.Generator().manual_seed(1), 2 * world, 16, 64))
ck.save_sharded(out / "ck", saved, saved_opt)
check("wrap_rolls_back", wrap_rolls_back)
check("another_models_latest", load_refused(lambda: GPT(**{**SMALL, "n_layer": 2}), "does not match the model"))
check(
    "another_dtype", load_refused(lambda: GPT(**SMALL).to(torch.bfloat16), "is float32 in the checkpoint but bfloat16")
)
check("another_optimizer", load_refused(lambda: GPT(**SMALL), "this one is 'torch.optim.sgd.SGD'", torch.optim.SGD))
(out / f"rank{rank}.json").write_text(json.dumps(results))
dist.destroy_process_group()
