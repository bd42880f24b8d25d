"""Our FSDP on the dtensor backend against torch's bare ``fully_shard`` applied by hand.

Run under torchrun (one process per device; gloo on CPU):

    torchrun --nproc_per_node 4 benchmarks/dtensor_fsdp_overhead.py [--steps 20] [--json runs/dtensor_fsdp_overhead.json]

Both wrap the same GPT-2-style model (one unit per block, the rest in the root) and train it
with AdamW on the same data, alternating step by step so load changes hit both alike. Reported
per rank 0: median step time and its ratio, bytes each rank holds for parameters, gradients and
optimizer state (the sharded state: what FSDP is for), and the collectives of one step as
torch's ``CommDebugMode`` sees them (`fsdp_xla.communication.dtensor_traffic_mode`): calls,
bytes each rank sends (ring algorithm) by phase, and their ratio to ZeRO-3's minimum
3 P (N - 1) / N. Target: ratio <= 1.02, memory and collectives equal.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from examples.train_fsdp import GPT, Block, lm_loss, synthetic_batch  # noqa: E402
from fsdp_xla import FSDP, transformer_auto_wrap_policy  # noqa: E402
from fsdp_xla.communication import Phase, bytes_by_phase, dtensor_traffic_mode, zero3_minimum_bytes  # noqa: E402
from mesh import Mesh  # noqa: E402
from spmd.backend import dtensor_device_mesh as device_mesh  # noqa: E402

BARE = "bare fully_shard"


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """This rank's bytes of parameters, gradients and optimizer state (local shards)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = sum(local(p).numel() * p.element_size() for p in model.parameters())
    total += sum(local(p.grad).numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    for s in optimizer.state.values():
        total += sum(local(v).numel() * v.element_size() for v in s.values() if isinstance(v, torch.Tensor))
    return total


def build(base: torch.nn.Module, mesh: Mesh) -> dict[str, torch.nn.Module]:
    ours = FSDP(copy.deepcopy(base), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    bare = copy.deepcopy(base)
    dm = device_mesh(mesh, "cpu")
    for block in bare.h:
        fully_shard(block, mesh=dm)
    fully_shard(bare, mesh=dm)
    return {"fsdp_xla FSDP": ours, BARE: bare}


def train(runs: dict[str, torch.nn.Module], steps: int, config: dict) -> dict[str, dict]:
    """``steps`` timed steps after two warm-ups, alternating the runs; step 1 is recorded."""
    rank, n = dist.get_rank(), dist.get_world_size()
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in runs.items()}
    out: dict[str, dict] = {k: {"times": [], "losses": [], "optimizer": optimizers[k]} for k in runs}
    gen = torch.Generator().manual_seed(0)
    for step in range(steps + 2):
        tokens = synthetic_batch(gen, 8 * n, config["seq"], config["vocab"]).chunk(n)[rank]
        for name, model in runs.items():
            mode = dtensor_traffic_mode() if step == 1 else None
            dist.barrier()
            started = time.perf_counter()
            with mode or contextlib.nullcontext():
                loss = lm_loss(model(tokens[:, :-1]), tokens)
                loss.backward()
                optimizers[name].step()
                optimizers[name].zero_grad(set_to_none=False)
            elapsed = time.perf_counter() - started
            if mode is not None:
                out[name]["mode"] = mode
            if step >= 2:  # two warm-up steps
                out[name]["times"].append(elapsed)
            out[name]["losses"].append(loss.item())
    return out


def make_row(name: str, model: torch.nn.Module, run: dict, base_time: float, minimum: int) -> dict:
    mode, records = run["mode"], run["mode"].records
    sent = sum(r.bytes_sent_per_device for r in records)
    med = statistics.median(run["times"])
    return {
        "run": name,
        "step_seconds": med,
        "ratio": med / base_time,
        "state_bytes_per_rank": state_bytes(model, run["optimizer"]),
        "collectives_per_step": mode.get_total_counts(),
        "collective_calls": {str(k): v for k, v in mode.get_comm_counts().items()},
        "bytes_sent_per_rank": sent,
        "sent_over_minimum": sent / minimum,
        "bytes_sent_by_phase": {p.value: b for p, b in bytes_by_phase(records).items()},
        "collectives": [r.to_dict() for r in records],
        "final_loss": run["losses"][-1],
    }


def print_rows(rows: list[dict], config: dict, n: int, steps: int, minimum: int, param_bytes: int) -> None:
    print(f"\nGPT {config} on {n} ranks (gloo), {steps} timed steps; ZeRO-3 minimum {minimum / 2**20:.2f} MiB/rank")
    print(
        f"{'run':<20}{'step ms':>10}{'ratio':>8}{'state/rank':>14}{'collectives/step':>18}"
        f"{'sent/rank':>14}{'sent/min':>10}{'final loss':>12}"
    )
    for r in rows:
        print(
            f"{r['run']:<20}{1e3 * r['step_seconds']:>10.1f}{r['ratio']:>8.3f}"
            f"{r['state_bytes_per_rank'] / 2**20:>10.2f} MiB{r['collectives_per_step']:>18}"
            f"{r['bytes_sent_per_rank'] / 2**20:>10.2f} MiB{r['sent_over_minimum']:>10.3f}{r['final_loss']:>12.4f}"
        )
    per_phase = param_bytes * (n - 1) // n
    for r in rows:
        print(f"  {r['run']}, by phase (x P(N-1)/N):")
        for phase in Phase:
            kinds = Counter(c["kind"] for c in r["collectives"] if c["phase"] == phase.value)
            text = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "-"
            sent = r["bytes_sent_by_phase"][phase.value]
            print(f"    {phase.value:20}{text:>28}{sent / 2**20:>10.2f} MiB{sent / per_phase:>8.3f}")


def main() -> None:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least, output_file

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=at_least(1), default=20)
    parser.add_argument("--layers", type=at_least(1), default=4)
    parser.add_argument("--d-model", type=at_least(1), default=256)
    parser.add_argument("--json", type=output_file, default=Path("runs") / "dtensor_fsdp_overhead.json")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = Mesh(np.arange(n), (n,), ("fsdp",))
    config = dict(vocab=512, d_model=args.d_model, n_head=4, n_layer=args.layers, seq=64)
    torch.manual_seed(0)
    base = GPT(**config)
    param_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    minimum = zero3_minimum_bytes(param_bytes, n)
    runs = build(base, mesh)
    results = train(runs, args.steps, config)
    base_time = statistics.median(results[BARE]["times"])
    rows = [make_row(name, runs[name], results[name], base_time, minimum) for name in runs]
    if rank == 0:
        print_rows(rows, config, n, args.steps, minimum, param_bytes)
        for r in rows:
            print(f"  {r['run']}: {r['collective_calls']}")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"config": config, "ranks": n, "minimum_bytes_sent_per_rank": minimum, "rows": rows}
        args.json.write_text(json.dumps(out, indent=1))
        print(f"JSON: {args.json}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
