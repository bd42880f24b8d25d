"""Run under torchrun by test_checkpoint_across_backends.py: DTensor FSDP checkpoints.

    torchrun --nproc_per_node N tests/fsdp_xla/dtensor_checkpoint_worker.py ACTION CKPT OUT.json [ACTION CKPT OUT.json ...]

Each job builds a fresh model. ``train_save``: 2 AdamW steps, save (model + optimizer), 2 more
steps; OUT holds those 2 losses. ``load_continue``: load (model + optimizer) into other initial
weights, 2 steps; OUT holds the saved extra and the losses. Batches are the GSPMD test's: each
rank takes its part.
"""

import json
import sys

import numpy as np
import torch
import torch.distributed as dist

import fsdp_xla.checkpoint as ck
from examples.train_fsdp import GPT, Block, rank_step, synthetic_batch
from fsdp_xla import FSDP, transformer_auto_wrap_policy
from mesh import Mesh

SMALL = dict(vocab=64, d_model=64, n_head=4, n_layer=3, seq=16)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = Mesh(np.arange(world), (world,), ("fsdp",))
gen = torch.Generator().manual_seed(1)
data = [synthetic_batch(gen, 16, SMALL["seq"], SMALL["vocab"]) for _ in range(4)]


def job(action: str, ckpt: str) -> dict:
    torch.manual_seed(0 if action == "train_save" else 7)
    model = FSDP(GPT(**SMALL), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    result = {}
    if action == "train_save":
        for tokens in data[:2]:
            rank_step(model, opt, tokens)
        ck.save_sharded(ckpt, model, opt, extra={"steps": 2})
    elif action == "load_continue":
        result["extra"] = ck.load_sharded(ckpt, model, opt)
    else:
        raise SystemExit(f"unknown action {action!r}")
    result["losses"] = [rank_step(model, opt, tokens) for tokens in data[2:]]
    return result


jobs = sys.argv[1:]
for i in range(0, len(jobs), 3):
    action, ckpt, out = jobs[i : i + 3]
    result = job(action, ckpt)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
dist.destroy_process_group()
