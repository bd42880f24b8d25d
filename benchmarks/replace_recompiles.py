"""Compiles of a loop that alternates a tensor between two shardings with mark_sharding(replace=True).

torch_xla reshards a tensor that holds device data with ``ReshardData``, which builds and
compiles a new identity program on every call (no cache; pjrt_computation_client.cpp), so the
loop compiles on every step. `spmd.mark_sharding` makes the tensor a traced value first and lets
the step's graph reshard it: two graph variants, each compiled once. Same loop, same process,
plain torch_xla first (``clear_sharding`` + ``xs.mark_sharding``, its way to replace), then ours.

    python benchmarks/replace_recompiles.py [--steps 20] [--json runs/replace_recompiles.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples._lane import exit_needing_torch_xla  # noqa: E402

exit_needing_torch_xla(__file__, "this benchmark (torch_xla's recompiles)")

from spmd import configure_default_devices  # noqa: E402

configure_default_devices(8)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.distributed.spmd as xs  # noqa: E402

import spmd  # noqa: E402
from spmd.backend import torch_xla_backend as backend  # noqa: E402

SPECS = [("data", "model"), ("model", "data")]


def plain_replace(t: torch.Tensor, mesh: xs.Mesh, spec: tuple) -> None:
    torch_xla._XLAC._xla_wait_device_ops(devices=[])  # torch_xla refuses to reshard data still being computed
    torch_xla._XLAC._xla_clear_sharding(t)
    xs.mark_sharding(t, mesh, spec)


def loop(replace, mesh, steps: int) -> dict:  # noqa: ANN001 (either library's mesh and call)
    torch.manual_seed(0)
    w = torch.randn(64, 64).to(torch_xla.device())
    before = backend.compile_count()
    per_step = []
    for i in range(steps):
        start = backend.compile_count()
        replace(w, mesh, SPECS[i % 2])
        w = w * 1.01 + 0.5
        torch_xla.sync()
        per_step.append(backend.compile_count() - start)
    return {"compiles": backend.compile_count() - before, "steps_that_compiled": sum(c > 0 for c in per_step)}


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least, output_file

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=at_least(1), default=20)
    parser.add_argument("--json", type=output_file, default=Path("runs") / "replace_recompiles.json")
    args = parser.parse_args(argv)
    spmd.enable_spmd()
    theirs = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    ours = spmd.Mesh(np.arange(8), (4, 2), ("data", "model"))
    result = {
        "steps": args.steps,
        "torch_xla": loop(plain_replace, theirs, args.steps),
        "ours": loop(lambda t, m, s: spmd.mark_sharding(t, m, s, replace=True), ours, args.steps),
    }
    result["compiles_ours_over_torch_xla"] = result["ours"]["compiles"] / result["torch_xla"]["compiles"]
    print(f"{'':10s} {'compiles':>8} {'steps that compiled':>20}   ({args.steps} steps)")
    for name in ("torch_xla", "ours"):
        print(f"{name:10s} {result[name]['compiles']:8d} {result[name]['steps_that_compiled']:20d}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()
    main()
