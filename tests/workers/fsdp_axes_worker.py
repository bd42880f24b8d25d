"""Run under torchrun by tests/fsdp_xla/test_fsdp_axes_dtensor.py: FSDP over several mesh axes and
HSDP on the dtensor backend (gloo, 4 ranks).

    torchrun --nproc_per_node 4 tests/workers/fsdp_axes_worker.py OUT_DIR

1. ``fsdp x context`` (2 x 2, the default axes of that mesh, flattened into one shard dim): four
   AdamW steps against the same model trained eagerly in one process, the first step's
   gradients, each rank's stored share of each parameter.
2. HSDP on ``data x fsdp`` (2 x 2): the same, the two replicas' shards compared, and one step's
   collectives as CommDebugMode records them (with their process groups).
3. HSDP with a flattened shard dim (``data x fsdp x context``, 2 x 2 x 1, ``fsdp_axis`` naming both:
   the default leaves the size-1 axis out): the 2-D mesh built from a flattened one (torch 2.15
   joins them, 2.9 slices the root).
4. Checkpoints across layouts: saved by ``fsdp`` 4 after two steps, loaded into 1., 2. and 3.;
   saved by HSDP and loaded into ``fsdp`` 4; each continues with the uninterrupted losses.

Every rank gives each its quarter of the batch (the four ranks are four data-parallel ranks in
every layout). Rank 0 writes results.json into OUT_DIR.
"""

import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import fsdp_xla.checkpoint as ck
from examples.train_fsdp import GPT, Block, lm_loss, synthetic_batch
from fsdp_xla import FSDP, transformer_auto_wrap_policy
from fsdp_xla.communication import dtensor_traffic_mode
from mesh import Mesh

SMALL = dict(vocab=64, d_model=64, n_head=4, n_layer=2, seq=16)
STEPS = 4

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(sys.argv[1])
policy = transformer_auto_wrap_policy({Block})
gen = torch.Generator().manual_seed(1)
data = [synthetic_batch(gen, 16, SMALL["seq"], SMALL["vocab"]) for _ in range(STEPS)]
torch.manual_seed(0)
initial = GPT(**SMALL)

LAYOUTS = {
    "fsdp_context": Mesh(np.arange(4), (2, 2), ("fsdp", "context")),
    "hsdp": Mesh(np.arange(4), (2, 2), ("data", "fsdp")),
    "hsdp_flat": Mesh(np.arange(4), (2, 2, 1), ("data", "fsdp", "context")),
}


def step(model, opt, tokens, grads=False):
    """One AdamW step on this rank's quarter of ``tokens``: (mean loss over the ranks, full
    gradients before the step or None)."""
    part = tokens.chunk(world)[rank]
    loss = lm_loss(model(part[:, :-1]), part)
    loss.backward()
    full = {n: p.grad.full_tensor() for n, p in model.named_parameters()} if grads else None
    opt.step()
    opt.zero_grad()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / world, full


def eager_run():
    model = copy.deepcopy(initial)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, first_grads = [], None
    for i, tokens in enumerate(data):
        loss = lm_loss(model(tokens[:, :-1]), tokens)
        loss.backward()
        if i == 0:
            first_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, first_grads


def rel_error(got, want):
    """max |got - want| / max |want| over the tensors (both dicts by name)."""
    return max((got[k] - v).abs().max().item() / max(v.abs().max().item(), 1e-30) for k, v in want.items())


def shares(model):
    """Each parameter's stored share on this rank (local elements / global elements)."""
    return {n: p.to_local().numel() / p.numel() for n, p in model.named_parameters()}


def replicas_identical(model):
    """Whether the ranks of each replica group (same shard, other replicate coordinate) store
    the same bytes: rank r against rank r + 2 on a (data 2, x 2) mesh."""
    mine = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
    every = [None] * world
    dist.all_gather_object(every, mine)
    return all(torch.equal(every[r][n], every[r + 2][n]) for r in range(2) for n in mine)


def traffic(model, opt):
    with dtensor_traffic_mode() as mode:
        step(model, opt, data[0])
    return [
        {"phase": r.phase.value, "kind": r.kind.value, "groups": [list(g) for g in r.replica_groups]}
        for r in mode.records
    ]


# The default leaves out the size-1 context axis: name the shard axes to flatten them.
AXES = {"hsdp_flat": {"fsdp_axis": ("fsdp", "context")}}


def trained(mesh_name, with_traffic=False):
    axes = AXES.get(mesh_name, {})
    model = FSDP(copy.deepcopy(initial), mesh=LAYOUTS[mesh_name], auto_wrap_policy=policy, **axes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    runs = [step(model, opt, tokens, grads=i == 0) for i, tokens in enumerate(data)]
    weight = model.h[0].c_fc.weight
    result = {
        "losses": [loss for loss, _ in runs],
        "grad_rel_error": rel_error(runs[0][1], EAGER_GRADS),
        "shares": sorted(set(shares(model).values())),
        "placements": [repr(p) for p in weight.placements],
        "mesh_dims": list(weight.device_mesh.mesh_dim_names),
        "replicas_identical": replicas_identical(model) if mesh_name != "fsdp_context" else None,
    }
    if with_traffic:
        result["traffic"] = traffic(model, opt)
    return result


def resumed(directory, mesh, **axes):
    torch.manual_seed(5)  # other weights: the load overwrites them
    model = FSDP(GPT(**SMALL), mesh=mesh, auto_wrap_policy=policy, **axes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    extra = ck.load_sharded(directory, model, opt)
    return model, opt, extra


def checkpoints_across_layouts():
    fsdp4 = Mesh(np.arange(4), (4,), ("fsdp",))
    model = FSDP(copy.deepcopy(initial), mesh=fsdp4, auto_wrap_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for tokens in data[:2]:
        step(model, opt, tokens)
    ck.save_sharded(out / "ck_fsdp4", model, opt, extra={"steps": 2})
    result = {"uninterrupted": [step(model, opt, t)[0] for t in data[2:]]}
    for name, mesh in LAYOUTS.items():
        other, other_opt, extra = resumed(out / "ck_fsdp4", mesh, **AXES.get(name, {}))
        if name == "hsdp":  # saved again by HSDP (one copy of each replicated block), into fsdp 4
            ck.save_sharded(out / "ck_hsdp", other, other_opt, extra=extra)
        result[name] = [step(other, other_opt, t)[0] for t in data[2:]]
    back, back_opt, _ = resumed(out / "ck_hsdp", fsdp4)
    result["hsdp_to_fsdp4"] = [step(back, back_opt, t)[0] for t in data[2:]]
    result["hsdp_files"] = sorted(p.name for p in ck.checkpoint_version(out / "ck_hsdp").glob("*.safetensors"))
    return result


EAGER_LOSSES, EAGER_GRADS = eager_run()
results = {
    "eager_losses": EAGER_LOSSES,
    "fsdp_context": trained("fsdp_context", with_traffic=True),
    "hsdp": trained("hsdp", with_traffic=True),
    "hsdp_flat": trained("hsdp_flat"),
    "checkpoints": checkpoints_across_layouts(),
}
if rank == 0:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results))
dist.destroy_process_group()
