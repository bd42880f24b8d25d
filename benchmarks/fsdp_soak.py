"""Soak: a long FSDP run of a tiny GPT must hold host memory flat and compile nothing new after warm-up.

Each step reads host RSS (``/proc/self/statm``) and torch_xla's ``CompileTime`` metric count.
After ``--warmup`` steps the RSS may drift at most ``--rss-tolerance`` (5 %) and the compile
count must not move. Prints a table, writes JSON; exit code 1 when either check fails.

    python benchmarks/fsdp_soak.py [--steps 200] [--warmup 20] [--json runs/fsdp_soak.json]
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
sys.path.insert(0, str(ROOT))

from examples._lane import exit_needing_torch_xla  # noqa: E402

exit_needing_torch_xla(__file__, "this benchmark (torch_xla's compile counter)")

from spmd import configure_default_devices  # noqa: E402

configure_default_devices(8)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
from tqdm import tqdm  # noqa: E402

import spmd  # noqa: E402
from examples.train_fsdp import GPT, Block, synthetic_batch, xla_step  # noqa: E402
from fsdp_xla import FSDP, transformer_auto_wrap_policy  # noqa: E402
from mesh import Mesh  # noqa: E402
from spmd.backend import torch_xla_backend as backend  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least, non_negative_float, output_file

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=at_least(1), default=200)
    parser.add_argument("--warmup", type=at_least(0), default=20)
    parser.add_argument("--rss-tolerance", type=non_negative_float, default=0.05)
    parser.add_argument("--json", type=output_file, default=Path("runs") / "fsdp_soak.json")
    args = parser.parse_args(argv)

    spmd.enable_spmd()
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    config = dict(vocab=128, d_model=64, n_head=4, n_layer=2, seq=32)
    torch.manual_seed(0)
    model = FSDP(GPT(**config), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    rss, compiles, times, losses = [], [], [], []
    for _ in tqdm(range(args.steps), desc="steps"):
        started = time.perf_counter()
        loss = xla_step(model, optimizer, synthetic_batch(gen, 16, config["seq"], config["vocab"]), mesh)
        xm.wait_device_ops()
        times.append(time.perf_counter() - started)
        losses.append(loss.item())
        rss.append(rss_bytes())
        compiles.append(backend.compile_count())

    w = args.warmup
    base = rss[w - 1]
    drift = max(abs(r - base) for r in rss[w:]) / base
    new_compiles = compiles[-1] - compiles[w - 1]
    ok = drift <= args.rss_tolerance and new_compiles == 0
    mib = 1 << 20
    print(f"\nFSDP soak: GPT {config}, 8 devices, {args.steps} steps ({w} warm-up)")
    print(f"{'':32}{'value':>14}")
    print(f"{'host RSS after warm-up':32}{base / mib:>11.1f} MiB")
    print(f"{'host RSS at the end':32}{rss[-1] / mib:>11.1f} MiB")
    print(f"{'largest drift after warm-up':32}{100 * drift:>12.2f} %   (limit {100 * args.rss_tolerance:.0f} %)")
    print(f"{'graphs compiled in warm-up':32}{compiles[w - 1]:>14}")
    print(f"{'graphs compiled after warm-up':32}{new_compiles:>14}")
    print(f"{'step time, median':32}{1e3 * statistics.median(times[w:]):>11.1f} ms")
    print(f"{'loss, first -> last':32}{losses[0]:>8.3f} -> {losses[-1]:.3f}")
    print("PASS" if ok else "FAIL")
    result = {
        "steps": args.steps,
        "warmup": w,
        "rss_after_warmup_bytes": base,
        "rss_end_bytes": rss[-1],
        "rss_max_drift": drift,
        "compiles_in_warmup": compiles[w - 1],
        "compiles_after_warmup": new_compiles,
        "step_seconds_median": statistics.median(times[w:]),
        "losses": [losses[0], losses[-1]],
        "rss_bytes": rss,
        "passed": ok,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(f"JSON: {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()
    sys.exit(main())
