"""Our FSDP on the dtensor backend against torch's bare ``fully_shard`` applied by hand.

Run under torchrun (one process per device; gloo on CPU):

    torchrun --nproc_per_node 4 benchmarks/dtensor_fsdp_overhead.py [--steps 20] [--json runs/dtensor_fsdp_overhead.json]

Both wrap the same GPT-2-style model (one unit per block, the rest in the root) and train it
with AdamW on the same data, alternating step by step so load changes hit both alike. Reported
per rank 0: median step time and its ratio, bytes each rank holds for parameters, gradients and
optimizer state (the sharded state: what FSDP is for), and collective calls and bytes per step
counted by torch's ``CommDebugMode``. Target: ratio <= 1.02, memory and collectives equal.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor.debug import CommDebugMode  # noqa: E402

from examples.train_fsdp import GPT, Block, lm_loss, synthetic_batch  # noqa: E402
from fsdp_xla import FSDP, transformer_auto_wrap_policy  # noqa: E402
from mesh import Mesh  # noqa: E402
from spmd._backend.dtensor_backend import device_mesh  # noqa: E402


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """This rank's bytes of parameters, gradients and optimizer state (local shards)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = sum(local(p).numel() * p.element_size() for p in model.parameters())
    total += sum(local(p.grad).numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    for s in optimizer.state.values():
        total += sum(local(v).numel() * v.element_size() for v in s.values() if isinstance(v, torch.Tensor))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--json", type=Path, default=Path("runs") / "dtensor_fsdp_overhead.json")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = Mesh(np.arange(n), (n,), ("fsdp",))
    config = dict(vocab=512, d_model=args.d_model, n_head=4, n_layer=args.layers, seq=64)
    torch.manual_seed(0)
    base = GPT(**config)

    ours = FSDP(copy.deepcopy(base), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    bare = copy.deepcopy(base)
    dm = device_mesh(mesh, "cpu")
    for block in bare.h:
        fully_shard(block, mesh=dm)
    fully_shard(bare, mesh=dm)

    runs = {"fsdp_xla FSDP": ours, "bare fully_shard": bare}
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in runs.items()}
    times: dict[str, list[float]] = {k: [] for k in runs}
    comm: dict[str, dict] = {}
    losses: dict[str, list[float]] = {k: [] for k in runs}
    gen = torch.Generator().manual_seed(0)
    for step in range(args.steps + 2):
        tokens = synthetic_batch(gen, 8 * n, config["seq"], config["vocab"]).chunk(n)[rank]
        for name, model in runs.items():
            mode = CommDebugMode() if step == 1 else None
            dist.barrier()
            started = time.perf_counter()
            with mode or _null():
                loss = lm_loss(model(tokens[:, :-1]), tokens)
                loss.backward()
                optimizers[name].step()
                optimizers[name].zero_grad(set_to_none=False)
            elapsed = time.perf_counter() - started
            if mode is not None:
                counts = {str(k): v for k, v in mode.get_comm_counts().items()}
                comm[name] = {"calls": counts, "total": mode.get_total_counts()}
            if step >= 2:  # two warm-up steps
                times[name].append(elapsed)
            losses[name].append(loss.item())

    rows = []
    base_time = statistics.median(times["bare fully_shard"])
    for name in runs:
        med = statistics.median(times[name])
        rows.append(
            {
                "run": name,
                "step_seconds": med,
                "ratio": med / base_time,
                "state_bytes_per_rank": state_bytes(runs[name], optimizers[name]),
                "collectives_per_step": comm[name]["total"],
                "collective_calls": comm[name]["calls"],
                "final_loss": losses[name][-1],
            }
        )
    if rank == 0:
        print(f"\nGPT {config} on {n} ranks (gloo), {args.steps} timed steps")
        print(f"{'run':<20}{'step ms':>10}{'ratio':>8}{'state/rank':>14}{'collectives/step':>18}{'final loss':>12}")
        for r in rows:
            print(
                f"{r['run']:<20}{1e3 * r['step_seconds']:>10.1f}{r['ratio']:>8.3f}"
                f"{r['state_bytes_per_rank'] / 2**20:>10.2f} MiB{r['collectives_per_step']:>18}{r['final_loss']:>12.4f}"
            )
        for r in rows:
            print(f"  {r['run']}: {r['collective_calls']}")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": config, "ranks": n, "rows": rows}, indent=1))
        print(f"JSON: {args.json}")
    dist.destroy_process_group()


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
