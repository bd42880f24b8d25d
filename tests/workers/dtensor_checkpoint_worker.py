"""Run under torchrun by test_checkpoint_across_backends.py: DTensor FSDP checkpoints.

    torchrun --nproc_per_node N tests/fsdp_xla/dtensor_checkpoint_worker.py ACTION CKPT OUT.json [ACTION CKPT OUT.json ...]

Each job builds a fresh model. ``train_save``: 2 AdamW steps, save (model + optimizer), 2 more
steps; OUT holds those 2 losses. ``load_continue``: load (model + optimizer) into other initial
weights, 2 steps; OUT holds the saved extra and the losses. ``refuse_on_one_rank``: rank 0 loads
a copy of CKPT with one flipped data byte in rank 1's file (a damaged node-local copy), the others
CKPT itself; OUT holds each rank's verdict and whether its model and optimizer stayed as they were.
``save_thrice``: 3 saves (model + optimizer, keep=1) into CKPT without loading it first (a new
lineage); OUT holds the versions written.
Batches are the GSPMD test's: each rank takes its part.
"""

import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import fsdp_xla.checkpoint as ck
from examples.train_fsdp import GPT, Block, rank_step, synthetic_batch
from fsdp_xla import FSDP, CheckpointError, transformer_auto_wrap_policy
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
    elif action == "refuse_on_one_rank":
        return refuse_on_one_rank(Path(ckpt), model, opt)
    elif action == "save_thrice":
        return {"written": [ck.save_sharded(ckpt, model, opt, keep=1, extra={"i": i}).name for i in range(3)]}
    else:
        raise SystemExit(f"unknown action {action!r}")
    result["losses"] = [rank_step(model, opt, tokens) for tokens in data[2:]]
    return result


def damaged_copy(ckpt: Path) -> Path:
    """A copy of ``ckpt`` with the first data byte of rank 1's file flipped."""
    bad = ckpt.with_name(ckpt.name + "-damaged")
    shutil.copytree(ckpt, bad)
    shard = ck.checkpoint_version(bad) / "device-00001.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[8 + int.from_bytes(raw[:8], "little")] ^= 0x01
    shard.write_bytes(bytes(raw))
    return bad


def refuse_on_one_rank(ckpt: Path, model, opt) -> dict:
    before = copy.deepcopy((model.state_dict(), opt.state_dict()))
    source = damaged_copy(ckpt) if rank == 0 else ckpt
    dist.barrier()
    try:
        ck.load_sharded(source, model, opt)
        verdict = "loaded"
    except CheckpointError as e:
        verdict = f"CheckpointError: {e}"
    after = (model.state_dict(), opt.state_dict())
    same = all(torch.equal(before[0][k].full_tensor(), v.full_tensor()) for k, v in after[0].items())
    same = same and all(
        torch.equal(before[1]["state"][i][f], after[1]["state"][i][f])
        for i in after[1]["state"]
        for f in after[1]["state"][i]
    )
    gathered = [None] * world
    dist.all_gather_object(gathered, {"verdict": verdict, "unchanged": same})
    return {"ranks": gathered}


jobs = sys.argv[1:]
for i in range(0, len(jobs), 3):
    action, ckpt, out = jobs[i : i + 3]
    result = job(action, ckpt)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
dist.destroy_process_group()
