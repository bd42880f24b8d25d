"""Run under torchrun (4 ranks, gloo) by tests/spmd/context/test_training.py: examples/train_long_context.py
(a causal llama-style model, grouped-query attention, rotary positions, FSDP over fsdp x context)
with context parallelism 1, 2 and 4, with tensor parallelism (context 2 x tensor 2), and resumed
from a CP 4 checkpoint at CP 2 and CP 1 (and from a CP 2 x TP 2 one at CP 4), in float32.

    torchrun --nproc_per_node 4 tests/workers/long_context_worker.py OUT_DIR

Rank 0 writes OUT_DIR/results.json: each run's losses, each parameter's gradient after one step
(gathered whole) of CP 1, 2, 4 and CP 2 x TP 2, and the messages of what FSDP refuses.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import spmd
from examples import train_long_context as example
from fsdp_xla import FSDP
from fsdp_xla.errors import FSDPError

out = Path(sys.argv[1])
SMALL = ["--seq", "64", "--batch", "4", "--d-model", "64", "--layers", "2", "--lr", "1e-3", "--backend", "dtensor"]


def gradients(context: int, tensor: int = 1) -> dict[str, list]:
    """Every parameter's gradient after one forward and backward on step 0's batch, whole."""
    args = example.parse_args([*SMALL, "--context", str(context), "--tensor", str(tensor)])
    devices, _ = example.start_runtime("dtensor")
    dims = example.ParallelDims.for_world(devices, context=context, tensor=tensor)
    model, plan, _ = example.build(args, dims)
    batch = example.split_batch(plan, dims, example.synthetic_tokens(0, 4, 64, args.vocab))
    logits = model(batch["input_ids"], batch["position_ids"])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).backward()
    whole = {}
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        whole[name] = grad.flatten().tolist()
    return whole


def tensor_parallel_over_an_fsdp_axis() -> str:
    """FSDP over fsdp x context of a model split over ``context`` by tensor parallelism: refused."""
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    dims = example.ParallelDims(context=2, tensor=2)
    mesh = dims.mesh()
    model = example.Llama(vocab=256, d_model=64, layers=1)
    parallelize_module(model.layers[0], spmd.device_mesh(mesh)["context"], {"gate": ColwiseParallel()})
    try:
        FSDP(model, mesh=mesh)
    except FSDPError as e:
        return str(e)
    return "accepted"


# every rank's path: the same directory, as on a shared filesystem
resumed = [*SMALL, "--checkpoint-dir", str(out / "checkpoints")]
resumed_tp = [*SMALL, "--checkpoint-dir", str(out / "checkpoints_tp")]
runs = {
    "cp 1": example.main([*SMALL, "--context", "1"]),
    "cp 2": example.main([*SMALL, "--context", "2"]),
    "cp 4": example.main([*SMALL, "--context", "4"]),
    "cp 4, no load balance": example.main([*SMALL, "--context", "4", "--no-load-balance"]),
    "cp 2, checkpointing": example.main([*SMALL, "--context", "2", "--checkpointing"]),
    # deferred init seeds each module from its path (the same weights on any mesh), not eager init's
    "cp 1, deferred init": example.main([*SMALL, "--context", "1", "--deferred-init"]),
    "cp 4, deferred init": example.main([*SMALL, "--context", "4", "--deferred-init"]),
    "cp 2 x tp 2": example.main([*SMALL, "--context", "2", "--tensor", "2"]),
    "cp 2 x tp 2, deferred init": example.main([*SMALL, "--context", "2", "--tensor", "2", "--deferred-init"]),
    # stopped after 5 steps with a checkpoint, then resumed (steps 5 to 9) at other context sizes
    "cp 4, saved at 5": example.main([*resumed, "--context", "4", "--steps", "5", "--save-every", "5"]),
    "cp 2, resumed at 5": example.main([*resumed, "--context", "2"]),
    "cp 1, resumed at 5": example.main([*resumed, "--context", "1"]),
    # the same across tensor parallelism: weights split over tensor x context, read back whole
    "cp 2 x tp 2, saved at 5": example.main(
        [*resumed_tp, "--context", "2", "--tensor", "2", "--steps", "5", "--save-every", "5"]
    ),
    "cp 4, resumed from cp 2 x tp 2 at 5": example.main([*resumed_tp, "--context", "4"]),
}
grads = {f"cp {c} x tp {t}": gradients(c, t) for c, t in ((1, 1), (2, 1), (4, 1), (2, 2))}
refusals = {"tensor parallel over an fsdp axis": tensor_parallel_over_an_fsdp_axis()}
if dist.get_rank() == 0:
    (out / "results.json").write_text(json.dumps({"losses": runs, "gradients": grads, "refusals": refusals}))
dist.destroy_process_group()
