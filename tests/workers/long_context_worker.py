"""Run under torchrun (4 ranks, gloo) by tests/spmd/context/test_training.py: examples/train_long_context.py
(a causal llama-style model, grouped-query attention, rotary positions, FSDP over fsdp x context)
with context parallelism 1, 2 and 4, in float32.

    torchrun --nproc_per_node 4 tests/workers/long_context_worker.py OUT_DIR

Rank 0 writes OUT_DIR/results.json: each run's 10 losses, and each parameter's gradient after one
step (gathered whole) of CP 1, 2 and 4.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from examples import train_long_context as example

out = Path(sys.argv[1])
SMALL = ["--seq", "64", "--batch", "4", "--d-model", "64", "--layers", "2", "--lr", "1e-3", "--backend", "dtensor"]


def gradients(context: int) -> dict[str, list]:
    """Every parameter's gradient after one forward and backward on step 0's batch, whole."""
    args = example.parse_args([*SMALL, "--context", str(context)])
    devices, _ = example.start_runtime("dtensor")
    dims = example.ParallelDims.for_world(devices, context=context)
    model, plan, _ = example.build(args, dims)
    batch = example.split_batch(plan, dims, example.synthetic_tokens(0, 4, 64, args.vocab))
    logits = model(batch["input_ids"], batch["position_ids"])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).backward()
    whole = {}
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        whole[name] = grad.flatten().tolist()
    return whole


runs = {
    "cp 1": example.main([*SMALL, "--context", "1"]),
    "cp 2": example.main([*SMALL, "--context", "2"]),
    "cp 4": example.main([*SMALL, "--context", "4"]),
    "cp 4, no load balance": example.main([*SMALL, "--context", "4", "--no-load-balance"]),
    "cp 2, checkpointing": example.main([*SMALL, "--context", "2", "--checkpointing"]),
    # deferred init seeds each module from its path (the same weights on any mesh), not eager init's
    "cp 1, deferred init": example.main([*SMALL, "--context", "1", "--deferred-init"]),
    "cp 4, deferred init": example.main([*SMALL, "--context", "4", "--deferred-init"]),
}
grads = {context: gradients(context) for context in (1, 2, 4)}
if dist.get_rank() == 0:
    (out / "results.json").write_text(json.dumps({"losses": runs, "gradients": grads}))
dist.destroy_process_group()
