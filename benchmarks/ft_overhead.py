"""What healing HSDP (torchft) costs a step when nothing fails, at several step sizes.

2 replica groups x 2 gloo ranks (4 processes, one torchrun per group, a lighthouse in this
process) train a 4-block MLP, one launch per step size. Inside a launch the ranks alternate
blocks of steps between three ways of averaging the gradient shards across the two groups, so
that every way meets the same load (this host is shared; runs launched one after another differ
by more than the effect):

- ``plain``: HSDP without torchft: a fixed gloo process group across the groups, summed and
  divided by 2 (what FSDP2's own HSDP all-reduce does), and the bare optimizer;
- ``torchft``: `fsdp_xla.ft` as shipped: `ReplicaGroup`'s hook and optimizer wrapper (the quorum
  starts at ``zero_grad`` and runs beside the forward; ``should_commit`` before the update);
- ``torchft_managed``: the same, but each shard through torchft's ``ManagedProcessGroup``
  (``dist.all_reduce(shard, group=managed, op=AVG)``), the hook fsdp_xla.ft used before;
- ``torchft_sync_quorum``: ``torchft`` with torchft's ``use_async_quorum=False`` (the quorum
  waited for in ``zero_grad`` instead of beside the forward; set on the Manager per block).

Reported per size: the median step time of each way (rank 0 of both groups; a block's first step
is left out, it may meet a rank still finishing the previous way), the ms added per step over
``plain`` and the ratio (medians over the cycles of the per-cycle differences and ratios, each
cycle one block of every way), the CPU time per step (what the rank itself spent: not inflated
by other jobs' load), and the phases (``zero_grad``, forward, backward with the all-reduces,
optimizer step with ``should_commit``).

    python benchmarks/ft_overhead.py --json runs/ft_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's fsdp_xla, not an installed one
GROUPS, NPROC, D, BLOCKS = 2, 2, 64, 4
WAYS = ("plain", "torchft", "torchft_managed", "torchft_sync_quorum")
PHASES = ("zero_grad", "forward", "backward", "optimizer_step")
# (name, hidden width, batch per rank): about 20, 100 and 500 ms a step on an idle 2-core host
SIZES = {"small": (64, 16), "medium": (512, 256), "large": (1024, 2048)}
STORE_ENV = "FT_OVERHEAD_STORE"


def child_env(store: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM"))}
    env.update(PYTHONPATH=str(ROOT), USE_TORCH_XLA="0", RUST_LOG="warn")
    env[STORE_ENV] = store
    return env


def worker(args: argparse.Namespace) -> None:
    """One rank of one replica group: alternate the ways block by block, write one JSON line per
    step (rank 0 only) to ``args.out/group{i}.jsonl``."""
    import torch
    import torch.distributed as dist

    import spmd
    from fsdp_xla import FSDP, ft, transformer_auto_wrap_policy
    from mesh import ParallelDims

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(D, args.hidden), torch.nn.Linear(args.hidden, D)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class Alternating(ft.ReplicaGroup):
        """The replica group whose hook averages by the way of the current block."""

        way = "torchft"

        def all_reduce_hook(self):
            from torchft.process_group import ManagedProcessGroup

            ours = super().all_reduce_hook()
            managed = ManagedProcessGroup(self.manager)
            managed.register(f"ft_overhead_{self.replica_id}")
            host, port = os.environ[STORE_ENV].rsplit(":", 1)
            store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False)
            fixed = dist.ProcessGroupGloo(dist.PrefixStore(f"rank{dist.get_rank()}", store), replica, GROUPS)
            options = dist.AllreduceOptions()
            options.reduceOp = dist.ReduceOp.SUM

            def hook(shard: torch.Tensor) -> None:
                if self.way == "plain":
                    fixed.allreduce([shard], options).wait()
                    shard.div_(GROUPS)
                elif self.way in ("torchft", "torchft_sync_quorum"):
                    ours(shard)
                else:
                    dist.all_reduce(shard, group=managed, op=dist.ReduceOp.AVG)

            return hook

    spmd.init_process_group("gloo", timeout=60)
    replica, rank = int(os.environ["REPLICA_GROUP_ID"]), dist.get_rank()
    group = Alternating(lighthouse=os.environ["TORCHFT_LIGHTHOUSE"], replica_id=replica, init_sync=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(Block() for _ in range(BLOCKS)), torch.nn.Linear(D, D))
    model = FSDP(
        model,
        mesh=ParallelDims(fsdp=dist.get_world_size()).mesh(),
        auto_wrap_policy=transformer_auto_wrap_policy({Block}),
        replicate_axis=group,
    )
    inner = torch.optim.AdamW(model.parameters(), lr=1e-4)
    healing = group.optimizer(inner, model)
    part = torch.Generator().manual_seed(1 + replica * NPROC + rank)
    x, y = torch.randn(args.batch, D, generator=part), torch.randn(args.batch, D, generator=part)
    out = open(args.out / f"group{replica}.jsonl", "w") if rank == 0 else None  # noqa: SIM115
    schedule = [("warmup", -1)] * args.warmup
    schedule += [(way, cycle) for cycle in range(args.cycles) for way in WAYS for _ in range(args.block)]
    previous = None
    for way, cycle in schedule:
        group.way = "torchft" if way == "warmup" else way
        optimizer = inner if group.way == "plain" else healing
        # torchft reads it at each start_quorum only (Manager(use_async_quorum=) sets it once)
        group.manager._use_async_quorum = group.way != "torchft_sync_quorum"
        marks = [time.perf_counter()]
        cpu = time.process_time()
        optimizer.zero_grad()
        marks.append(time.perf_counter())
        loss = torch.nn.functional.mse_loss(model(x), y)
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        optimizer.step()
        loss.item()
        marks.append(time.perf_counter())
        if out is not None and way != "warmup":
            phases = {p: b - a for p, a, b in zip(PHASES, marks, marks[1:])}
            first = (way, cycle) != previous  # a block's first step
            record = {"way": way, "cycle": cycle, "first": first, "seconds": marks[-1] - marks[0]}
            out.write(json.dumps({**record, "cpu": time.process_time() - cpu, **phases}) + "\n")
        previous = (way, cycle)
    if out is not None:
        out.close()
    group.shutdown()
    dist.destroy_process_group()


def launch(size: str, args: argparse.Namespace) -> list[dict]:
    """One launch (2 groups x 2 ranks) at ``size``; the records of rank 0 of both groups."""
    import torch.distributed as dist

    from fsdp_xla import ft

    out = args.out / size
    out.mkdir(parents=True, exist_ok=True)
    hidden, batch = SIZES[size]
    train = ["--worker", "--hidden", str(hidden), "--batch", str(batch), "--out", str(out)]
    train += ["--cycles", str(args.cycles), "--block", str(args.block), "--warmup", str(args.warmup)]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the fixed group's rendezvous
    with ft.Lighthouse(min_replicas=1, bind="[::]:0", heartbeat_timeout=5.0) as lighthouse:
        groups = ft.launch_groups(
            __file__,
            train,
            lighthouse=lighthouse.address,
            groups=GROUPS,
            nproc_per_group=NPROC,
            max_restarts=0,
            env=child_env(f"127.0.0.1:{store.port}"),
            log_dir=out,
        )
        codes = [g.wait(timeout=args.run_timeout) for g in groups]
    if any(codes):
        raise RuntimeError(f"a replica group failed ({codes}); see {out}/group*.log")
    records = []
    for path in sorted(out.glob("group*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines()]
    return records


def summarize(records: list[dict]) -> dict:
    """Per way: medians of step time, CPU and phases (ms); per torchft way: ms added per step
    over plain and the ratio, medians over the cycles of each cycle's block medians."""
    kept = [r for r in records if not r["first"]]
    ms = lambda values: 1e3 * statistics.median(values)  # noqa: E731
    summary: dict = {}
    for way in WAYS:
        mine = [r for r in kept if r["way"] == way]
        summary[way] = {"steps": len(mine), "step_ms": ms([r["seconds"] for r in mine])}
        summary[way]["cpu_ms"] = ms([r["cpu"] for r in mine])
        summary[way].update({f"{p}_ms": ms([r[p] for r in mine]) for p in PHASES})
    cycles = sorted({r["cycle"] for r in kept})

    def block(way: str, cycle: int) -> float:
        return statistics.median(r["seconds"] for r in kept if r["way"] == way and r["cycle"] == cycle)

    for way in WAYS[1:]:
        added = [block(way, c) - block("plain", c) for c in cycles]
        ratios = [block(way, c) / block("plain", c) for c in cycles]
        q1, _, q3 = statistics.quantiles(added, n=4)  # the spread between cycles: what the load does
        summary[way].update(added_ms=1e3 * statistics.median(added), ratio=statistics.median(ratios))
        summary[way].update(added_ms_quartiles=(1e3 * q1, 1e3 * q3))
        summary[way]["cycles"] = len(cycles)
    return summary


def table(results: dict) -> str:
    head = f"{'size':<7} {'way':<20} {'step ms':>8} {'added ms':>9} {'ratio':>6} {'quartiles':>15} {'cpu ms':>7}"
    head += "  phases ms (zero_grad/fwd/bwd/opt)"
    lines = [head]
    for size, summary in results.items():
        for way in WAYS:
            s = summary[way]
            if "added_ms" in s:
                q1, q3 = s["added_ms_quartiles"]
                added = f"{s['added_ms']:+9.1f} {s['ratio']:6.3f} {f'{q1:+.1f}..{q3:+.1f}':>15}"
            else:
                added = f"{'':9} {'':6} {'':15}"
            phases = "/".join(f"{s[f'{p}_ms']:.1f}" for p in PHASES)
            lines.append(f"{size:<7} {way:<20} {s['step_ms']:8.1f} {added} {s['cpu_ms']:7.1f}  {phases}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=list(SIZES))
    parser.add_argument("--cycles", type=int, default=8, help="blocks of every way, in turn")
    parser.add_argument("--block", type=int, default=6, help="steps per block")
    parser.add_argument("--warmup", type=int, default=6, help="steps before the first block (torchft's way)")
    parser.add_argument("--run-timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=Path("runs/ft_overhead"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    os.environ.setdefault("RUST_LOG", "warn")  # the lighthouse in this process: a line per quorum otherwise
    results = {size: summarize(launch(size, args)) for size in args.sizes}
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        partial = args.json.with_name(args.json.name + ".partial")
        partial.write_text(json.dumps({"sizes": {k: SIZES[k] for k in results}, "results": results}, indent=1))
        os.replace(partial, args.json)  # whole or not at all
    return 0


if __name__ == "__main__":
    sys.exit(main())
