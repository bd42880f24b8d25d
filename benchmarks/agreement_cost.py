"""What the ranks' agreement check costs per call, on 4 CPU ranks with gloo.

Each rank of a multi-process job exchanges a fixed-size fingerprint before a collective entry
point (`spmd._backend.agreement`). This times, interleaved round by round so that load on the
machine hits every arm alike:

- ``agree``: the check alone (one all_gather of 16 int64 per rank);
- ``mark_sharding``: `spmd.mark_sharding` of a small (64, 64) tensor, check included;
- ``unchecked``: the same layout without the check (`resolve_sharding` + the backend's ``shard``);
- ``before``: the exchange main made before the check existed for the same call (an
  ``all_gather_object`` of the shape, pickled: two collectives).

    python benchmarks/agreement_cost.py [--calls 200] [--rounds 5]

Rank 0 prints the median microseconds per call of each arm.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch(calls: int, rounds: int) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM"))}
    env.update(PYTHONPATH=str(ROOT), USE_TORCH_XLA="0")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4"]
    command += [__file__, "--worker", "--calls", str(calls), "--rounds", str(rounds)]
    return subprocess.run(command, env=env, check=False).returncode


def worker(calls: int, rounds: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    import spmd
    from mesh import Mesh
    from spmd import P
    from spmd._backend.agreement import agree, sharding_fields
    from spmd.backend import backend_for
    from spmd.mark_sharding import resolve_sharding

    spmd.init_process_group("gloo", timeout=60)
    spmd.use_backend("dtensor")
    mesh, t = Mesh(np.arange(4), (4,), ("x",)), torch.ones(64, 64)
    runtime = backend_for(t)

    def unchecked():
        sharding, hlo = resolve_sharding(t, mesh, P("x"), "mark_sharding", runtime)
        runtime.shard(t, sharding, hlo, replace=False)

    def before():
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, (t.dim(), *t.shape))

    arms = {
        "agree": lambda: agree(runtime, "mark_sharding", sharding_fields(t, mesh, P("x")), "fix"),
        "mark_sharding": lambda: spmd.mark_sharding(t, mesh, P("x")),
        "unchecked": unchecked,
        "before": before,
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    unchecked()  # builds the DeviceMesh once, outside the timings
    for _ in range(rounds):
        for name, call in arms.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    if dist.get_rank() == 0:
        for name, values in times.items():
            print(f"{name:>14}: {float(np.median(values)):8.1f} us per call (rounds: {[round(v) for v in values]})")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=at_least(1), default=200)
    parser.add_argument("--rounds", type=at_least(1), default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.calls, args.rounds)
    else:
        sys.exit(launch(args.calls, args.rounds))


if __name__ == "__main__":
    main()
