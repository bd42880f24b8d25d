"""Host memory of building a >1B-parameter GPT-2 sharded over 8 devices: deferred vs eager.

    python benchmarks/deferred_init_memory.py          # ~1.1 B parameters, 4.4 GB in fp32

Each way runs in its own process (peak RSS is per process), on 8 virtual CPU devices, where
device memory is host memory: the sharded model itself takes its full size in RSS.

- deferred: ``FSDP(deferred_init(GPT, **config), ...)``: parameters live on the meta device
  until FSDP materializes one unit at a time on the host, initializes it, and sends its
  shards to the devices.
- eager, ``model.to(xla)``: the whole model is built and initialized on the host (what
  ``AutoModelForCausalLM.from_config`` does) and moved to the device before sharding, as a
  training script or the Trainer's device placement does. In SPMD mode that is a replicated
  copy on every device: 9 copies of the model on 8 virtual CPU devices, so a watchdog stops
  the process once its RSS passes ``--eager-limit`` x the sharded total.
- eager, torch_xla FSDPv2: built on the host, then ``SpmdFullyShardedDataParallel`` (it moves
  and shards one wrapped block at a time).
- eager, fsdp_xla: built on the host, then ``FSDP`` sends each parameter's shards and drops
  the host tensor, one parameter at a time.

Targets (issue 4): deferred peak RSS < 1.3 x sharded total + largest unit; eager >= 2 x.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(vocab=50257, d_model=2048, n_head=16, n_layer=20, seq=1024)
MODES = {
    "deferred": "deferred init, fsdp_xla",
    "eager_to_device": "eager, model.to(xla)",
    "eager_torch_xla": "eager, torch_xla FSDPv2",
    "eager_fsdp_xla": "eager, fsdp_xla",
}


def rss_bytes(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def watchdog(limit_bytes: int, mode: str) -> None:
    """Stop this process (printing a RESULT) once its RSS passes ``limit_bytes``."""
    import os
    import threading

    def watch() -> None:
        peak = 0
        while True:
            rss = rss_bytes("VmRSS")
            peak = max(peak, rss)
            if rss > limit_bytes:
                print("RESULT " + json.dumps({"mode": mode, "stopped_at_rss_bytes": rss}), flush=True)
                os._exit(3)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()


def child(mode: str, config: dict, eager_limit: float) -> dict:
    sys.path.insert(0, str(ROOT))
    from spmd import configure_default_devices

    configure_default_devices(8)
    import numpy as np
    import torch
    import torch_xla

    import spmd
    from examples.train_fsdp import GPT, Block
    from fsdp_xla import FSDP, deferred_init, transformer_auto_wrap_policy
    from mesh import Mesh

    spmd.enable_spmd()
    torch.ones(1).to(torch_xla.device()).sum().item()  # start the runtime before the baseline
    baseline = rss_bytes("VmRSS")
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    started = time.perf_counter()
    model = deferred_init(GPT, **config) if mode == "deferred" else GPT(**config)
    constructed = rss_bytes("VmRSS")  # the model built, no shard on a device yet
    if mode in ("deferred", "eager_fsdp_xla"):
        model = FSDP(model, mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    elif mode == "eager_to_device":
        watchdog(baseline + int(eager_limit * 4 * sum(p.numel() for p in model.parameters())), mode)
        model = model.to(torch_xla.device())
        model = FSDP(model, mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    else:
        import functools

        import torch_xla.distributed.spmd as xs
        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy as xla_policy
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        policy = functools.partial(xla_policy, transformer_layer_cls={Block})
        model = SpmdFullyShardedDataParallel(
            model, mesh=xs.Mesh(np.arange(8), (8,), ("fsdp",)), auto_wrap_policy=policy
        )
        model = model.module
    seconds = time.perf_counter() - started
    params = sum(p.numel() for p in model.parameters())
    unit = 4 * sum(p.numel() for p in model.h[0].parameters())
    root = 4 * params - 4 * config["n_layer"] * sum(p.numel() for p in model.h[0].parameters())
    return {
        "mode": mode,
        "parameters": params,
        "sharded_total_bytes": 4 * params,
        "largest_unit_bytes": max(unit, root),
        "baseline_rss_bytes": baseline,
        "constructed_rss_bytes": constructed,
        "peak_rss_bytes": rss_bytes("VmHWM"),
        "final_rss_bytes": rss_bytes("VmRSS"),
        "build_seconds": seconds,
        "on_device": all(p.device.type == "xla" for p in model.parameters()),
    }


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least, output_file, positive_float

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=at_least(1), default=CONFIG["n_layer"])
    parser.add_argument("--d-model", type=at_least(1), default=CONFIG["d_model"])
    parser.add_argument("--json", type=output_file, default=Path("runs") / "deferred_init_memory.json")
    parser.add_argument(
        "--eager-limit", type=positive_float, default=2.5, help="stop the torch_xla eager run past this x"
    )
    parser.add_argument("--child", choices=list(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    config = {**CONFIG, "n_layer": args.layers, "d_model": args.d_model}
    if args.child:
        print("RESULT " + json.dumps(child(args.child, config, args.eager_limit)))
        return {}

    results = {}
    for mode in MODES:
        cmd = [sys.executable, __file__, "--child", mode, "--layers", str(args.layers), "--d-model", str(args.d_model)]
        cmd += ["--eager-limit", str(args.eager_limit)]
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{mode} run failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
        results[mode] = json.loads(line.removeprefix("RESULT "))

    d = results["deferred"]
    total, unit = d["sharded_total_bytes"], d["largest_unit_bytes"]
    budget = 1.3 * total + unit
    gib = 2**30
    print(
        f"GPT-2 {config}: {d['parameters']:,} parameters = {total / gib:.2f} GiB fp32, largest unit {unit / gib:.2f} GiB"
    )
    print(f"{'':28}{'built, host':>12}{'peak RSS':>11}{'x sharded':>11}{'time':>8}")
    for mode, r in results.items():
        if "stopped_at_rss_bytes" in r:
            stop = r["stopped_at_rss_bytes"]
            print(
                f"{MODES[mode]:28}{'':>12}{'>' + f'{stop / gib:.2f}':>8}GiB{'>' + f'{stop / total:.2f}':>11}  stopped"
            )
            continue
        host = (r["constructed_rss_bytes"] - r["baseline_rss_bytes"]) / gib
        print(
            f"{MODES[mode]:28}{host:>9.2f}GiB{r['peak_rss_bytes'] / gib:>8.2f}GiB{r['peak_rss_bytes'] / total:>11.2f}"
            f"{r['build_seconds']:>7.1f}s"
        )
    print("(built, host: RSS above the started runtime once the model is constructed, before any shard exists)")
    print(
        f"deferred: peak {d['peak_rss_bytes'] / gib:.2f} GiB vs budget 1.3 x sharded + largest unit = "
        f"{budget / gib:.2f} GiB: {'met' if d['peak_rss_bytes'] < budget else 'NOT met'}"
    )
    eager_peak = max(
        r.get("stopped_at_rss_bytes", r.get("peak_rss_bytes", 0)) for m, r in results.items() if m != "deferred"
    )
    print(
        f"eager: largest peak {eager_peak / total:.2f} x sharded (target >= 2): "
        f"{'met' if eager_peak >= 2 * total else 'NOT met'}"
    )
    out = {"config": config, "budget_bytes": budget, "results": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(f"JSON: {args.json}")
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from examples._lane import exit_needing_torch_xla

    exit_needing_torch_xla(__file__, "this benchmark (FSDP on GSPMD's virtual devices)")
    main()
