"""Run under torchrun by test_compile_dtensor.py: torch.compile of a training step of our FSDP on
DTensor, against torch's bare ``fully_shard`` and against eager.

    torchrun --nproc_per_node 2 tests/fsdp_xla/compile_dtensor_worker.py OUT_DIR

The example GPT (3 blocks), wrapped once with ``fsdp_xla.FSDP`` (a unit per block) and once with
``fully_shard`` on each block and then the root, as a user would by hand; fp32 and bf16 mixed
precision. Each is trained 3 AdamW steps eagerly and 3 steps with the forward and loss under
``torch.compile(backend="aot_eager")`` (AOTAutograd traces the backward too; ``loss.backward()``
and ``optimizer.step()`` run outside, as usual), from the same weights on the same rows. For
each compiled run, Dynamo's counters: graph breaks (with their reasons), unique graphs and the
calls captured into graphs. A last run compiles our FSDP of a model whose blocks break the graph
on purpose (``torch._dynamo.graph_break()``), so the test sees that a break would be counted.
Last, ``with_sharding_constraint`` on a DTensor inside a compiled function.
Rank 0 writes results.json into OUT_DIR.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch._dynamo
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from examples.train_fsdp import GPT, Block, lm_loss, synthetic_batch
from fsdp_xla import FSDP, MixedPrecision, transformer_auto_wrap_policy
from mesh import Mesh
from spmd import P, mark_sharding, with_sharding_constraint

SMALL = dict(vocab=64, d_model=64, n_head=4, n_layer=3, seq=16)
STEPS, BATCH = 3, 8

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(sys.argv[1])
mesh = Mesh(np.arange(world), (world,), ("fsdp",))
gen = torch.Generator().manual_seed(1)
rows = [synthetic_batch(gen, BATCH, SMALL["seq"], SMALL["vocab"]).chunk(world)[rank] for _ in range(STEPS)]


class BreakingBlock(Block):
    """A block that breaks the graph between attention and MLP, as untraceable code would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        torch._dynamo.graph_break()
        return x + self.c_proj(torch.nn.functional.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def gpt(block_class=Block):
    torch.manual_seed(0)
    model = GPT(**SMALL)
    for block in model.h:
        block.__class__ = block_class
    return model


def ours(model, bf16):
    precision = MixedPrecision(torch.bfloat16) if bf16 else None
    return FSDP(model, mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}), mixed_precision=precision)


def bare(model, bf16):
    """fully_shard by hand, per block and then the root (torch's defaults otherwise)."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 else None
    kwargs = {"mp_policy": policy} if policy else {}
    for block in model.h:
        fully_shard(block, **kwargs)
    return fully_shard(model, **kwargs)


def train(model, compiled):
    """STEPS AdamW steps on this rank's rows; the mean loss over ranks of each step, and Dynamo's
    counters of the compile (reset first: every compiled run starts from an empty cache)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def forward_loss(tokens):
        return lm_loss(model(tokens[:, :-1]), tokens)

    if compiled:
        torch._dynamo.reset()
        counters.clear()
        forward_loss = torch.compile(forward_loss, backend="aot_eager")
    losses = []
    for tokens in rows:
        loss = forward_loss(tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().float().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    if not compiled:
        return {"losses": losses}
    breaks = dict(counters["graph_break"])
    mine = {
        "graph_breaks": sum(breaks.values()),
        "break_reasons": sorted({reason.split("\n")[0] for reason in breaks}),
        "unique_graphs": counters["stats"]["unique_graphs"],
        "calls_captured": counters["stats"]["calls_captured"],
    }
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    return {"losses": losses, **mine, "same_on_every_rank": all(r == mine for r in everyone)}


results = {"torch": torch.__version__}
for precision in ("fp32", "bf16"):
    for name, wrap in (("ours", ours), ("bare", bare)):
        bf16 = precision == "bf16"
        results[f"{name}_{precision}"] = {
            "eager": train(wrap(gpt(), bf16), compiled=False),
            "compiled": train(wrap(gpt(), bf16), compiled=True),
        }
results["ours_with_a_break"] = {"compiled": train(ours(gpt(BreakingBlock), False), compiled=True)}


def constrained(x, w):
    return with_sharding_constraint((x @ w).relu(), mesh, P()).sum()


torch.manual_seed(0)
x, w = mark_sharding(torch.randn(8, 6), mesh, P("fsdp")), mark_sharding(torch.randn(6, 4), mesh, P())
torch._dynamo.reset()
counters.clear()
results["with_sharding_constraint"] = {
    "eager": constrained(x, w).full_tensor().item(),
    "compiled": torch.compile(constrained, backend="aot_eager")(x, w).full_tensor().item(),
    "graph_breaks": sum(counters["graph_break"].values()),
    "unique_graphs": counters["stats"]["unique_graphs"],
}

if rank == 0:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
dist.destroy_process_group()
