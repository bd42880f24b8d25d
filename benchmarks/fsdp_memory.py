"""FSDP memory, communication and step time: fsdp_xla against torch_xla's own FSDPv2, in one run.

    python benchmarks/fsdp_memory.py                      # 8 virtual CPU devices, ~2 minutes
    python benchmarks/fsdp_memory.py --layers 8 --d-model 768 --json runs/fsdp_memory.json

The same GPT-2-style model (examples/train_fsdp.py), mesh, batch and AdamW run under:

- ``fsdp_xla``: ``FSDP(model, auto_wrap_policy=transformer_auto_wrap_policy({Block}))``;
- ``fsdp_xla, no barriers``: the same with ``optimization_barriers=False`` (for contrast);
- ``torch_xla FSDPv2``: ``SpmdFullyShardedDataParallel`` with the same wrap policy.

Per-device peak bytes come from XLA's buffer assignment of each compiled graph of a steady
step (the largest graph's peak; ``spmd.inspector``), collective bytes from its partitioned
HLO (ring algorithm), step time is the median wall time of the timed steps. The ZeRO-3
bound is 16 P / N bytes of weights, gradients and Adam state, plus one unit's gathered
weights, plus the activations, measured as the growth of fsdp_xla's peak when the batch
doubles.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spmd import configure_default_devices  # noqa: E402

configure_default_devices()

import spmd.inspector as inspector  # noqa: E402

inspector.prepare()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.distributed.spmd as xs  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402
from tqdm import tqdm  # noqa: E402

import spmd  # noqa: E402
from examples.train_fsdp import GPT, Block, lm_loss, synthetic_batch, xla_step  # noqa: E402
from fsdp_xla import FSDP, transformer_auto_wrap_policy  # noqa: E402
from fsdp_xla._runtime import BACKWARD_GRAPH_NAME  # noqa: E402
from mesh import Mesh  # noqa: E402
from spmd import P, mark_sharding  # noqa: E402
from spmd.inspector import format_bytes  # noqa: E402


@dataclass
class Result:
    name: str
    peak_bytes: int
    bytes_sent_per_device: int
    step_seconds: float
    step_seconds_spread: tuple[float, float]
    graphs: list[str]
    losses: list[float]
    forward_backward_peak: int | None


def build(kind: str, config: dict, mesh: Mesh):
    torch.manual_seed(0)
    model = GPT(**config)
    if kind == "torch_xla":
        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy as xla_policy
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        n = mesh.size()
        xla_mesh = xs.Mesh(np.arange(n), (n,), ("fsdp",))
        policy = functools.partial(xla_policy, transformer_layer_cls={Block})
        wrapped = SpmdFullyShardedDataParallel(model, mesh=xla_mesh, auto_wrap_policy=policy)
        # .to() inside FSDPv2 unties GPT-2's embeddings; tie them again, as torch_xla advises.
        wrapped.module.lm_head.weight = wrapped.module.wte.weight
        return wrapped
    return FSDP(
        model,
        mesh=mesh,
        auto_wrap_policy=transformer_auto_wrap_policy({Block}),
        optimization_barriers=(kind != "fsdp_xla_no_barriers"),
    )


def steady_graphs(report: inspector.Report) -> list[inspector.GraphReport]:
    """The graphs a steady step runs: the last compiled of each name prefix."""
    last: dict[str, inspector.GraphReport] = {}
    for g in report.graphs:
        last[g.name.split(".")[0]] = g
    return list(last.values())


def run(kind: str, config: dict, mesh: Mesh, batch: int, warmup: int, timed: int) -> Result:
    model = build(kind, config, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step() -> torch.Tensor:
        return xla_step(model, optimizer, synthetic_batch(gen, batch, config["seq"], config["vocab"]), mesh)

    with inspector.capture(ignore=["parameter-all-gather", "replicated-argument", "replicated-activation"]) as report:
        losses = [step().detach() for _ in tqdm(range(warmup), desc=f"{kind}: compile + warm-up", leave=False)]
    xm.wait_device_ops()
    times = []
    for _ in tqdm(range(timed), desc=f"{kind}: timed steps", leave=False):
        started = time.perf_counter()
        losses.append(step().detach())
        xm.wait_device_ops()
        times.append(time.perf_counter() - started)
    graphs = steady_graphs(report.report)
    return Result(
        name=kind,
        peak_bytes=max(g.memory.peak_bytes for g in graphs if g.memory),
        bytes_sent_per_device=sum(g.bytes_sent_per_device for g in graphs),
        step_seconds=statistics.median(times),
        step_seconds_spread=(min(times), max(times)),
        graphs=[g.name for g in graphs],
        losses=[float(x) for x in losses],
        forward_backward_peak=next(
            (g.memory.peak_bytes for g in graphs if g.name.startswith(BACKWARD_GRAPH_NAME) and g.memory), None
        ),
    )


def activation_bytes(config: dict, mesh: Mesh, batch: int, peak_at_batch: int) -> int:
    """Growth of fsdp_xla's forward+backward peak when the batch doubles (activations only)."""
    peaks = [peak_at_batch]
    for b in tqdm((2 * batch,), desc="activations (batch x2)", leave=False):
        model = build("fsdp_xla", config, mesh)
        tokens = synthetic_batch(torch.Generator().manual_seed(b), b, config["seq"], config["vocab"])
        with inspector.capture(ignore=["parameter-all-gather", "replicated-argument"]) as report:
            tokens = tokens.to(torch_xla.device())
            mark_sharding(tokens, mesh, P("fsdp", None))
            lm_loss(model(tokens[:, :-1]), tokens).backward()
            torch_xla.sync()
        (graph,) = [g for g in report.graphs if g.name.startswith(BACKWARD_GRAPH_NAME)]
        peaks.append(graph.memory.peak_bytes)
    return peaks[1] - peaks[0]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="global batch")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--json", type=Path, default=Path("runs") / "fsdp_memory.json")
    args = parser.parse_args(argv)

    spmd.enable_spmd()
    n = xr.global_runtime_device_count()
    mesh = Mesh(np.arange(n), (n,), ("fsdp",))
    config = dict(vocab=args.vocab, d_model=args.d_model, n_head=args.heads, n_layer=args.layers, seq=args.seq)
    reference = GPT(**config)
    n_params = sum(p.numel() for p in reference.parameters())
    unit_params = sum(p.numel() for p in reference.h[0].parameters())
    root_params = n_params - args.layers * unit_params
    del reference

    results = [
        run(k, config, mesh, args.batch, args.warmup, args.steps)
        for k in tqdm(("torch_xla", "fsdp_xla", "fsdp_xla_no_barriers"), desc="configurations")
    ]
    ours = next(r for r in results if r.name == "fsdp_xla")
    assert ours.forward_backward_peak is not None
    activations = activation_bytes(config, mesh, args.batch, ours.forward_backward_peak)
    states = 16 * n_params // n
    largest_unit = 4 * max(unit_params, root_params)
    bound = states + largest_unit + activations
    baseline = results[0]

    names = {"torch_xla": "torch_xla FSDPv2", "fsdp_xla": "fsdp_xla", "fsdp_xla_no_barriers": "fsdp_xla, no barriers"}
    print(
        f"\nGPT {config}: {n_params:,} parameters, {args.layers} blocks of {unit_params:,}; batch {args.batch}; {n} devices"
    )
    print(
        f"ZeRO-3 bound per device: states 16P/N {format_bytes(states)} + one unit {format_bytes(largest_unit)} "
        f"+ activations {format_bytes(activations)} = {format_bytes(bound)}\n"
    )
    header = f"{'':24}{'peak/device':>14}{'x bound':>9}{'sent/device/step':>18}{'step time':>11}{'x torch_xla':>13}"
    print(header)
    rows = []
    for r in results:
        row = {
            **asdict(r),
            "label": names[r.name],
            "peak_over_bound": r.peak_bytes / bound,
            "peak_over_torch_xla": r.peak_bytes / baseline.peak_bytes,
            "step_time_over_torch_xla": r.step_seconds / baseline.step_seconds,
        }
        rows.append(row)
        print(
            f"{names[r.name]:24}{format_bytes(r.peak_bytes):>14}{row['peak_over_bound']:>9.2f}"
            f"{format_bytes(r.bytes_sent_per_device):>18}{r.step_seconds * 1000:>9.0f}ms{row['step_time_over_torch_xla']:>13.3f}"
        )
    print(f"{'ZeRO-3 bound':24}{format_bytes(bound):>14}{1.0:>9.2f}")
    out = {
        "config": config,
        "batch": args.batch,
        "devices": n,
        "platform": xr.device_type(),
        "parameters": n_params,
        "unit_parameters": unit_params,
        "bound_bytes": {"states": states, "largest_unit": largest_unit, "activations": activations, "total": bound},
        "results": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(args.json)
    print(f"\nJSON: {args.json}")
    return out


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    main()
