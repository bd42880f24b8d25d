"""Tracing cost of keeping `mark_sharding`'s return value, against torch_xla's XLAShardedTensor.

``x = mark_sharding(x, ...)`` returns an `XLAShardedTensor`; every op on it (and on what is
computed from it) passes through its ``__torch_function__``. This measures how much longer
torch_xla takes to *trace* one forward + backward of a small GPT when its input is that view,
compared with the plain tensor (``mark_sharding(x, ...)`` with the return value unused, which
shards ``x`` in place and costs nothing per op), and tries the same with torch_xla's own
``XLAShardedTensor`` wrapper. Device time is the same in all cases (the same graph runs).

    python benchmarks/sharded_tensor_tracing.py [--layers 4] [--repeats 12] [--json runs/tracing.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples._lane import exit_needing_torch_xla  # noqa: E402

exit_needing_torch_xla(__file__, "this benchmark (torch_xla's tracing)")

from spmd import configure_default_devices  # noqa: E402

configure_default_devices(8)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.distributed.spmd as xs  # noqa: E402
from tqdm import tqdm  # noqa: E402

import spmd  # noqa: E402
from examples.train_fsdp import GPT, lm_loss  # noqa: E402
from mesh import Mesh  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least, output_file

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=at_least(1), default=4)
    parser.add_argument("--repeats", type=at_least(1), default=12, help="timed traces per mode (after 2 warm-up)")
    parser.add_argument("--json", type=output_file, default=Path("runs") / "sharded_tensor_tracing.json")
    args = parser.parse_args(argv)

    spmd.enable_spmd()
    device = torch_xla.device()
    mesh = Mesh(np.arange(8), (8,), ("data",))
    their_mesh = xs.Mesh(np.arange(8), (8,), ("data",))
    model = GPT(vocab=256, d_model=128, n_head=4, n_layer=args.layers, seq=64).to(device)
    tokens = torch.randint(0, 256, (16, 64))

    def trace(mode: str) -> float:
        t = tokens.to(device)
        if mode == "torch_xla XLAShardedTensor":
            x = xs.mark_sharding(t, their_mesh, ("data", None))
        else:
            view = spmd.mark_sharding(t, mesh, ("data", None))
            x = view if mode == "ours, returned view" else t
        started = time.perf_counter()
        loss = lm_loss(model(x[:, :-1]), x)
        loss.backward()
        elapsed = time.perf_counter() - started
        torch_xla.sync()
        model.zero_grad(set_to_none=True)
        return elapsed

    modes = ["plain tensor (in place)", "ours, returned view", "torch_xla XLAShardedTensor"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    failures: dict[str, str] = {}
    for m in modes:  # warm-up: compile once per mode
        try:
            trace(m)
            trace(m)
        except Exception as e:  # torch_xla's wrapper fails here in torch_xla 2.9
            failures[m] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    for _ in tqdm(range(args.repeats), desc="timed traces"):
        for m in modes:  # interleaved, so load changes hit every mode alike
            if m not in failures:
                times[m].append(trace(m))

    base = statistics.median(times[modes[0]])
    rows = []
    print(f"\nTrace time of one forward + backward, GPT {args.layers} layers, 8 devices ({args.repeats} traces)")
    print(f"{'input':<30}{'median ms':>11}{'x plain':>9}")
    for m in modes:
        if m in failures:
            print(f"{m:<30}{'fails':>11}   {failures[m]}")
            rows.append({"mode": m, "error": failures[m]})
            continue
        med = statistics.median(times[m])
        print(f"{m:<30}{med * 1e3:>11.2f}{med / base:>9.2f}")
        rows.append({"mode": m, "median_s": med, "min_s": min(times[m]), "max_s": max(times[m]), "ratio": med / base})
    result = {"layers": args.layers, "repeats": args.repeats, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(f"\nJSON: {args.json}")
    return result


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()
    main()
