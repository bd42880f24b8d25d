"""Run under torchrun by test_dtensor_fsdp.py: fsdp_xla.FSDP on the dtensor backend.

    torchrun --nproc_per_node 4 tests/fsdp_xla/dtensor_fsdp_worker.py OUT_DIR

Five AdamW steps of the example GPT (per-block units, tied embeddings) against the same model
trained eagerly in one process on the whole batch, plain and with gradient checkpointing,
param_spec_fn and shard_output; a bf16 mixed-precision step; deferred init; the collectives of
one step, as torch's CommDebugMode sees them. Where torch orders process groups as the mesh
does (2.15), the same training on a reversed mesh, saved after 3 steps and resumed on an
in-order mesh.
Rank 0 writes results.json (losses, largest parameter difference) and deferred.pt (the deferred
model's full weights) into OUT_DIR.
"""

import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import fsdp_xla.checkpoint as ck
from examples.train_fsdp import GPT, Block, lm_loss, rank_step, synthetic_batch
from fsdp_xla import FSDP, FSDPError, MixedPrecision, deferred_init, transformer_auto_wrap_policy
from fsdp_xla.communication import bytes_by_phase, dtensor_traffic_mode
from mesh import Mesh
from spmd import P
from spmd._util import torch_compat

SMALL = dict(vocab=64, d_model=64, n_head=4, n_layer=3, seq=16)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(sys.argv[1])
mesh = Mesh(np.arange(world), (world,), ("fsdp",))
policy = transformer_auto_wrap_policy({Block})
gen = torch.Generator().manual_seed(1)
data = [synthetic_batch(gen, 16, SMALL["seq"], SMALL["vocab"]) for _ in range(5)]
per_rank = 16 // world

torch.manual_seed(0)
eager = GPT(**SMALL)
initial = copy.deepcopy(eager)
# The rounding floor: the same training in one process with the batch summed in 4 parts, as the
# ranks do; Adam turns rounding-level gradient differences into visible parameter differences.
split = copy.deepcopy(eager)
model = FSDP(copy.deepcopy(eager), mesh=mesh, auto_wrap_policy=policy)
assert model.lm_head.weight is model.wte.weight  # tied weights stay one parameter
opt, eager_opt = torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(eager.parameters(), lr=1e-2)
losses, eager_losses = [], []
for tokens in data:
    losses.append(rank_step(model, opt, tokens))  # each rank trains on its part of the batch
    eager_loss = lm_loss(eager(tokens[:, :-1]), tokens)
    eager_loss.backward()
    eager_opt.step()
    eager_opt.zero_grad()
    eager_losses.append(eager_loss.item())
split_opt = torch.optim.AdamW(split.parameters(), lr=1e-2)
for tokens in data:
    for part in tokens.split(per_rank):
        (lm_loss(split(part[:, :-1]), part) / world).backward()
    split_opt.step()
    split_opt.zero_grad()
floor = max((p - q).abs().max().item() for p, q in zip(split.state_dict().values(), eager.state_dict().values()))
wrap_errors = []  # wrapping again, the model or a module holding it, is refused by FSDP itself
for target in (model, torch.nn.Sequential(model)):
    try:
        FSDP(target, mesh=mesh)
        wrap_errors.append("accepted")
    except FSDPError as e:
        wrap_errors.append(str(e))
full = {k: v.full_tensor() for k, v in model.state_dict().items()}
param_diff = max((full[k] - v).abs().max().item() for k, v in eager.state_dict().items())
sharded = all(
    type(p).__name__ == "DTensor" and p.to_local().shape[0] <= -(-p.shape[0] // world) for p in model.parameters()
)

# One more step under torch's CommDebugMode, read by fsdp_xla.communication (after the comparisons).
with dtensor_traffic_mode() as mode:
    lm_loss(model(data[0][:per_rank, :-1]), data[0][:per_rank]).backward()
    opt.step()
    opt.zero_grad()
traffic: dict = {}
for r in mode.records:
    traffic.setdefault(r.phase.value, {}).setdefault(r.kind.value, 0)
    traffic[r.phase.value][r.kind.value] += 1
traffic_bytes = {p.value: b for p, b in bytes_by_phase(mode.records).items()}
param_bytes = sum(p.numel() * p.element_size() for p in eager.parameters())
root_param_bytes = param_bytes - sum(p.numel() * p.element_size() for p in eager.h.parameters())


# The GSPMD options FSDP2 can express: checkpointing, a per-parameter shard dim, the output layout.
def spec(name, p):  # 2-D weights on their second dim (64 and 256 divide by 4), the rest default
    return P(None, "fsdp") if p.dim() == 2 and "wpe" not in name else P("fsdp")


options = FSDP(
    copy.deepcopy(initial),
    mesh=mesh,
    auto_wrap_policy=policy,
    gradient_checkpointing=True,
    param_spec_fn=spec,
    shard_output=P("fsdp"),
)
ln_calls = []
options.h[0].ln_1.register_forward_hook(lambda *_: ln_calls.append(1))
options_opt = torch.optim.AdamW(options.parameters(), lr=1e-2)
options_losses = []
for i, tokens in enumerate(data):
    options_losses.append(rank_step(options, options_opt, tokens))
    if i == 0:
        forwards_in_first_step = len(ln_calls)  # 2: the forward, and the recompute in backward
options_full = {k: v.full_tensor() for k, v in options.state_dict().items()}
options_diff = max((options_full[k] - v).abs().max().item() for k, v in eager.state_dict().items())
placements = {name: [repr(x) for x in p.placements] for name, p in options.named_parameters()}

torch.manual_seed(0)
bf16 = FSDP(GPT(**SMALL), mesh=mesh, auto_wrap_policy=policy, mixed_precision=MixedPrecision(torch.bfloat16))
local = data[0][rank * per_rank : (rank + 1) * per_rank]
bf16_loss = lm_loss(bf16(local[:, :-1]), local)
bf16_loss.backward()
bf16_dtypes = sorted({str(p.dtype) for p in bf16.parameters()})

deferred = FSDP(deferred_init(GPT, **SMALL), mesh=mesh, auto_wrap_policy=policy, init_seed=0)
deferred_full = {k: v.full_tensor() for k, v in deferred.state_dict().items()}

permuted_result = {}
if torch_compat.ordered_groups_supported():  # FSDP's gathers, reduce-scatters and checkpoints on [3, 2, 1, 0]
    permuted = Mesh(np.arange(world)[::-1].copy(), (world,), ("fsdp",))
    on_permuted = FSDP(copy.deepcopy(initial), mesh=permuted, auto_wrap_policy=policy)
    permuted_opt = torch.optim.AdamW(on_permuted.parameters(), lr=1e-2)
    permuted_losses = [rank_step(on_permuted, permuted_opt, tokens) for tokens in data[:3]]
    ck.save_sharded(out / "permuted_ck", on_permuted, permuted_opt, extra={"steps": 3})
    permuted_losses += [rank_step(on_permuted, permuted_opt, tokens) for tokens in data[3:]]
    permuted_full = {k: v.full_tensor() for k, v in on_permuted.state_dict().items()}
    torch.manual_seed(5)  # other weights, overwritten by the load
    resumed = FSDP(GPT(**SMALL), mesh=mesh, auto_wrap_policy=policy)
    resumed_opt = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    resumed_extra = ck.load_sharded(out / "permuted_ck", resumed, resumed_opt)
    permuted_result = {
        "permuted_losses": permuted_losses,
        "permuted_param_diff": max((permuted_full[k] - v).abs().max().item() for k, v in eager.state_dict().items()),
        "permuted_local_rows": on_permuted.lm_head.weight.to_local().shape[0],
        "resumed_extra": resumed_extra,
        "resumed_losses": [rank_step(resumed, resumed_opt, tokens) for tokens in data[3:]],
    }

if rank == 0:
    out.mkdir(parents=True, exist_ok=True)
    torch.save(deferred_full, out / "deferred.pt")
    result = {
        "losses": losses,
        "eager_losses": eager_losses,
        "param_diff": param_diff,
        "rounding_floor": floor,
        "sharded": sharded,
        "wrap_errors": wrap_errors,
        "bf16_loss": bf16_loss.item(),
        "bf16_param_dtypes": bf16_dtypes,
        "options_losses": options_losses,
        "options_param_diff": options_diff,
        "options_forwards_in_first_step": forwards_in_first_step,
        "options_placements": placements,
        **permuted_result,
        "traffic": traffic,
        "traffic_bytes": traffic_bytes,
        "param_bytes": param_bytes,
        "root_param_bytes": root_param_bytes,
    }
    (out / "results.json").write_text(json.dumps(result))
dist.destroy_process_group()
