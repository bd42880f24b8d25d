"""How often a long mark_sharding training loop on 8 virtual CPU devices aborts in XLA's rendezvous.

The fault: torch_xla 2.9's CPU runtime runs the 8 devices' parts of a step on threads of one
process; every collective is an in-process rendezvous that aborts the process (SIGABRT, exit 134,
``rendezvous.cc:127 Termination timeout for `all reduce` of 10 seconds exceeded``) when one
device's thread arrives more than 10 s after the first. XLA 2.9's CPU collectives hard-code that
timeout (``kTerminateTimeout`` in ``in_process_communicator.cc``; later XLA releases read
``--xla_cpu_collective_call_terminate_timeout_seconds``, torch_xla 2.9's XLA has no such flag).

Arms, run interleaved (ABCABC...) so that they share the machine's load:

- ``ours``: `spmd.configure_default_devices` + `spmd.mark_sharding` (our XLA flags: the
  memory-minimizing CPU scheduler, ``--xla_cpu_enable_concurrency_optimized_scheduler=false``);
- ``plain``: torch_xla only (``PJRT_DEVICE=CPU CPU_NUM_DEVICES=8``, ``xs.mark_sharding``), no flags;
- ``plain_sched``: torch_xla only, with our scheduler flag (tells whether the flag matters);
- ``ours_default_sched``: ours with XLA's default CPU scheduler.

The same model, batches and shardings in every arm (2-D data x model mesh, inputs and
activations marked every step). Each trial is a fresh process under ``nice``; the table gives
per arm: runs, aborts, near misses (XLA's 5 s "may be stuck" warnings), median wall time, and
the 1-minute load average around the runs (``os.getloadavg``; this machine has 2 cores).

    python benchmarks/rendezvous_abort.py [--trials 20] [--steps 300] [--arms ours,plain] [--json runs/rendezvous_abort.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
ARMS = ("ours", "plain", "plain_sched", "ours_default_sched")
ABORT = "Termination timeout"
NEAR_MISS = "may be stuck"


def child(arm: str, steps: int, width: int, batch: int) -> None:
    """One trial: the training loop of ``arm`` for ``steps`` steps (in this process)."""
    if arm.startswith("ours"):
        sys.path.insert(0, str(ROOT))
        from spmd import configure_default_devices

        configure_default_devices(8)
        if arm == "ours_default_sched":
            os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"].replace(SCHEDULER_FLAG, "").strip()
    import numpy as np
    import torch_xla
    import torch_xla.runtime as xr

    xr.use_spmd()
    if arm.startswith("ours"):
        from spmd import Mesh, mark_sharding

        mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    else:
        import torch_xla.distributed.spmd as xs

        mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
        mark_sharding = xs.mark_sharding
    _train(mesh, mark_sharding, steps, torch_xla.device(), width, batch)
    print(f"done {steps} steps", flush=True)


def _train(mesh, mark_sharding, steps: int, device, d: int, batch: int) -> None:  # noqa: ANN001 (either library's mesh)
    import torch
    import torch.nn.functional as F
    import torch_xla

    torch.manual_seed(0)
    vocab, seq = 64, 32
    layers = [torch.nn.Linear(d, 4 * d).to(device) for _ in range(2)] + [torch.nn.Linear(4 * d, d).to(device)]
    emb = torch.nn.Embedding(vocab, d).to(device)
    head = torch.nn.Linear(d, vocab).to(device)
    mark_sharding(emb.weight, mesh, (None, "model"))
    for lin in layers[:2]:
        mark_sharding(lin.weight, mesh, ("model", None))
    mark_sharding(layers[2].weight, mesh, (None, "model"))
    params = [p for m in (*layers, emb, head) for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=gen)
        tokens = ((start + torch.arange(seq + 1)) % vocab).to(device)
        mark_sharding(tokens, mesh, ("data", None))
        x = emb(tokens[:, :-1])
        h = F.gelu(layers[0](x)) * layers[1](x)
        mark_sharding(h, mesh, ("data", None, "model"))
        x = x + layers[2](h)
        loss = F.cross_entropy(head(x).reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch_xla.sync()
    loss.item()


def _child_env(arm: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM"))}
    if not arm.startswith("ours"):
        env.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES="8")
        if arm == "plain_sched":
            env["XLA_FLAGS"] = SCHEDULER_FLAG
    return env


def trial(arm: str, args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    command = ["nice", "-n", str(args.nice), sys.executable, __file__, "--child", arm, "--steps", str(args.steps)]
    command += ["--width", str(args.width), "--batch", str(args.batch)]
    try:
        run = subprocess.run(command, env=_child_env(arm), capture_output=True, text=True, timeout=args.timeout)
        code, err = run.returncode, run.stderr
    except subprocess.TimeoutExpired as e:
        code, err = "timeout", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else ""
    return {
        "arm": arm,
        "exit": code,
        "aborted": ABORT in err,
        "near_misses": err.count(NEAR_MISS),
        "seconds": round(time.perf_counter() - started, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "abort_line": next((line for line in err.splitlines() if ABORT in line), "")[:300],
    }


def summarize(results: list[dict], arms: list[str]) -> list[dict]:
    rows = []
    for arm in arms:
        mine = [r for r in results if r["arm"] == arm]
        rows.append(
            {
                "arm": arm,
                "runs": len(mine),
                "aborts": sum(r["aborted"] for r in mine),
                "other_failures": sum(r["exit"] != 0 and not r["aborted"] for r in mine),
                "runs_with_near_misses": sum(r["near_misses"] > 0 for r in mine),
                "median_seconds": statistics.median(r["seconds"] for r in mine) if mine else None,
                "load_1min_median": statistics.median(r["load_before"] for r in mine) if mine else None,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least, output_file, positive_float

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=at_least(1), default=20, help="runs per arm")
    parser.add_argument("--steps", type=at_least(1), default=300)
    parser.add_argument("--arms", default="ours,plain", help=f"comma-separated, of {','.join(ARMS)}")
    parser.add_argument("--width", type=at_least(1), default=64, help="model width (d_model)")
    parser.add_argument("--batch", type=at_least(1), default=16)
    parser.add_argument("--nice", type=at_least(0, 19), default=10)
    parser.add_argument("--timeout", type=positive_float, default=1800)
    parser.add_argument("--json", type=output_file, default=Path("runs") / "rendezvous_abort.json")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.steps, args.width, args.batch)
        return []
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {list(ARMS)}")
    results = []
    for i in range(args.trials):
        for arm in arms:
            results.append(trial(arm, args))
            r = results[-1]
            print(
                f"trial {i + 1:2d} {arm:18s} exit {r['exit']!s:>7}  aborted {r['aborted']!s:5}  near misses "
                f"{r['near_misses']:2d}  {r['seconds']:6.1f} s  load {r['load_before']:.1f}->{r['load_after']:.1f}",
                flush=True,
            )
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(
                json.dumps({"config": vars(args) | {"json": str(args.json)}, "results": results}, indent=1)
            )
    rows = summarize(results, arms)
    print(f"\n{'arm':18s} {'runs':>4} {'aborts':>6} {'other':>5} {'near-miss runs':>14} {'median s':>8} {'load':>5}")
    for row in rows:
        print(
            f"{row['arm']:18s} {row['runs']:4d} {row['aborts']:6d} {row['other_failures']:5d} "
            f"{row['runs_with_near_misses']:14d} {row['median_seconds']:8.1f} {row['load_1min_median']:5.1f}"
        )
    args.json.write_text(
        json.dumps(
            {
                "config": vars(args) | {"json": str(args.json)},
                "cores": os.cpu_count(),
                "summary": rows,
                "results": results,
            },
            indent=1,
        )
    )
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from examples._lane import exit_needing_torch_xla

    exit_needing_torch_xla(__file__, "this benchmark (torch_xla's CPU runtime)")
    main()
