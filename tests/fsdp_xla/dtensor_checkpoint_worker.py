"""Run under torchrun by test_checkpoint_across_backends.py: DTensor FSDP checkpoints.

    torchrun --nproc_per_node 4 tests/fsdp_xla/dtensor_checkpoint_worker.py ACTION CKPT OUT.json

``train_save``: 2 AdamW steps, save (model + optimizer), 2 more steps; OUT holds those 2 losses.
``load_continue``: a fresh model, load (model + optimizer), 2 steps; OUT holds the losses and
the loaded full weights' checksum. Batches are the GSPMD test's: each rank takes its part.
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

action, ckpt, out = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = Mesh(np.arange(world), (world,), ("fsdp",))
gen = torch.Generator().manual_seed(1)
data = [synthetic_batch(gen, 16, SMALL["seq"], SMALL["vocab"]) for _ in range(4)]
torch.manual_seed(0 if action == "train_save" else 7)
model = FSDP(GPT(**SMALL), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)


def step(tokens):
    return rank_step(model, opt, tokens)


result = {}
if action == "train_save":
    for tokens in data[:2]:
        step(tokens)
    ck.save_sharded(ckpt, model, opt, extra={"steps": 2})
    result["losses"] = [step(tokens) for tokens in data[2:]]
else:
    result["extra"] = ck.load_sharded(ckpt, model, opt)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    result["checksum"] = float(sum(v.double().abs().sum() for v in full.values()))
    result["losses"] = [step(tokens) for tokens in data[2:]]
if rank == 0:
    with open(out, "w") as f:
        json.dump(result, f)
dist.destroy_process_group()
