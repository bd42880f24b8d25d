"""FSDP memory, communication and step time: fsdp_xla against torch_xla's own FSDPv2, in one run.

    python benchmarks/fsdp_memory.py                      # 8 virtual CPU devices, ~6 minutes
    torchrun --nproc_per_node 4 benchmarks/dtensor_fsdp_overhead.py   # without torch_xla: the DTensor counterpart
    python benchmarks/fsdp_memory.py --layers 8 --d-model 768 --no-tpu --json runs/fsdp_memory.json

The same GPT-2-style model (examples/train_fsdp.py), mesh, batch and AdamW run under:

- ``fsdp_xla``: ``FSDP(model, auto_wrap_policy=transformer_auto_wrap_policy({Block}))``;
- ``fsdp_xla, no barriers``: the same with ``optimization_barriers=False`` (for contrast);
- ``torch_xla FSDPv2``: ``SpmdFullyShardedDataParallel`` with the same wrap policy.

Per-device peak bytes come from XLA's buffer assignment of each compiled graph of a steady
step (the largest graph's peak; ``spmd.inspector``), collective bytes from its partitioned
HLO (ring algorithm), step time is the median wall time of the timed steps (the
configurations take turns step by step). The ZeRO-3
bound is 16 P / N bytes of weights, gradients and Adam state, plus one unit's gathered
weights, plus the activations, measured as the growth of fsdp_xla's peak when the batch
doubles.

Communication is set against ZeRO-3's minimum, 3 P (N - 1) / N bytes sent per device per
step (``sent/min``). Every collective of fsdp_xla's step is attributed to its unit and phase
(`fsdp_xla.communication`; a table per phase and per unit, and each collective in the JSON).
``TPU sent/min`` is the same steady graphs compiled again by libtpu for a v5e slice of as many
chips (`spmd.plan.compile.recompile`; skip with ``--no-tpu``): XLA's CPU compiler reduces gradients with
an all-reduce and a slice where libtpu reduce-scatters (docs/fsdp.md). Matmuls are traced at
'highest' precision so that compile keeps fp32 weights, as the minimum counts them.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples._lane import exit_needing_torch_xla  # noqa: E402

exit_needing_torch_xla(
    __file__,
    "this benchmark (XLA's buffer assignment, with torch_xla's FSDPv2 as the baseline)",
    "Its DTensor counterpart: torchrun --nproc_per_node 4 benchmarks/dtensor_fsdp_overhead.py (our FSDP against "
    "FSDP2's fully_shard: state bytes, collectives, step time).",
)

from spmd import configure_default_devices  # noqa: E402

configure_default_devices()

import spmd.inspector as inspector  # noqa: E402

inspector.prepare()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.backends  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.distributed.spmd as xs  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402
from tqdm import tqdm  # noqa: E402

import spmd  # noqa: E402
from examples.train_fsdp import GPT, Block, lm_loss, synthetic_batch, xla_step  # noqa: E402
from fsdp_xla import FSDP, transformer_auto_wrap_policy  # noqa: E402
from fsdp_xla._gspmd_unit import BACKWARD_GRAPH_NAME  # noqa: E402
from fsdp_xla.communication import (  # noqa: E402
    CollectiveRecord,
    Phase,
    attribute,
    bytes_by_phase,
    counts_by_unit,
    zero3_minimum_bytes,
)
from mesh import Mesh  # noqa: E402
from spmd import P, mark_sharding  # noqa: E402
from spmd.inspector import format_bytes  # noqa: E402
from spmd.plan.compile.recompile import RecompileError, tpu_step_collectives  # noqa: E402


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
    collectives: list[CollectiveRecord]
    tpu: dict | None  # the same graphs compiled by libtpu: bytes sent by kind, or why not


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


def tpu_figures(graphs: list[inspector.GraphReport], devices: int) -> dict:
    """The same graphs compiled by libtpu for a v5e slice of as many chips: bytes sent per
    device by collective kind (XLA:CPU keeps reductions as all-reduce + slice; see docs/fsdp.md)."""
    by_kind: dict[str, int] = {}
    try:
        for g in graphs:
            for c in tpu_step_collectives(Path(g.hlo_path), devices):
                by_kind[c.kind.value] = by_kind.get(c.kind.value, 0) + c.bytes_sent_per_device
    except (RecompileError, ImportError, OSError) as e:
        return {"error": str(e).splitlines()[0]}
    return {"slice": f"v5e-{devices}", "bytes_sent_by_kind": by_kind, "bytes_sent_per_device": sum(by_kind.values())}


@dataclass
class Prepared:
    """A configuration compiled and warmed up, ready for timed steps."""

    kind: str
    step: Callable[[], torch.Tensor]
    graphs: list[inspector.GraphReport]
    losses: list[torch.Tensor]


def prepare(kind: str, config: dict, mesh: Mesh, batch: int, warmup: int) -> Prepared:
    """Build ``kind``, compile and warm it up under the inspector (its steady graphs)."""
    model = build(kind, config, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step() -> torch.Tensor:
        return xla_step(model, optimizer, synthetic_batch(gen, batch, config["seq"], config["vocab"]), mesh)

    with inspector.capture(ignore=["parameter-all-gather", "replicated-argument", "replicated-activation"]) as report:
        losses = [step().detach() for _ in tqdm(range(warmup), desc=f"{kind}: compile + warm-up", leave=False)]
    xm.wait_device_ops()
    return Prepared(kind, step, steady_graphs(report.report), losses)


def time_interleaved(runs: list[Prepared], timed: int) -> dict[str, list[float]]:
    """Wall time of ``timed`` steps of each run, the runs taking turns step by step, so a change
    of load on this shared machine hits them alike."""
    times: dict[str, list[float]] = {r.kind: [] for r in runs}
    for _ in tqdm(range(timed), desc="timed steps (interleaved)", leave=False):
        for r in runs:
            started = time.perf_counter()
            r.losses.append(r.step().detach())
            xm.wait_device_ops()
            times[r.kind].append(time.perf_counter() - started)
    return times


def result(r: Prepared, times: list[float], devices: int, tpu: bool) -> Result:
    graphs = r.graphs
    return Result(
        name=r.kind,
        peak_bytes=max(g.memory.peak_bytes for g in graphs if g.memory),
        bytes_sent_per_device=sum(g.bytes_sent_per_device for g in graphs),
        step_seconds=statistics.median(times),
        step_seconds_spread=(min(times), max(times)),
        graphs=[g.name for g in graphs],
        losses=[float(x) for x in r.losses],
        forward_backward_peak=next(
            (g.memory.peak_bytes for g in graphs if g.name.startswith(BACKWARD_GRAPH_NAME) and g.memory), None
        ),
        collectives=attribute(graphs),
        tpu=tpu_figures(graphs, devices) if tpu else None,
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


NAMES = {"torch_xla": "torch_xla FSDPv2", "fsdp_xla": "fsdp_xla", "fsdp_xla_no_barriers": "fsdp_xla, no barriers"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least, output_file

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=at_least(1), default=6)
    parser.add_argument("--d-model", type=at_least(1), default=512)
    parser.add_argument("--heads", type=at_least(1), default=8)
    parser.add_argument("--vocab", type=at_least(2), default=2048)
    parser.add_argument("--seq", type=at_least(1), default=128)
    parser.add_argument("--batch", type=at_least(1), default=16, help="global batch")
    parser.add_argument("--warmup", type=at_least(0), default=3)
    parser.add_argument("--steps", type=at_least(1), default=8, help="timed steps")
    parser.add_argument("--no-tpu", action="store_true", help="skip compiling the graphs again for a TPU slice")
    parser.add_argument("--json", type=output_file, default=Path("runs") / "fsdp_memory.json")
    return parser.parse_args(argv)


def result_row(r: Result, bound: int, minimum: int, baseline: Result) -> dict:
    tpu_sent = (r.tpu or {}).get("bytes_sent_per_device")
    return {
        **{k: v for k, v in asdict(r).items() if k != "collectives"},
        "label": NAMES[r.name],
        "peak_over_bound": r.peak_bytes / bound,
        "peak_over_torch_xla": r.peak_bytes / baseline.peak_bytes,
        "sent_over_minimum": r.bytes_sent_per_device / minimum,
        "tpu_sent_over_minimum": tpu_sent / minimum if tpu_sent is not None else None,
        "step_time_over_torch_xla": r.step_seconds / baseline.step_seconds,
        "bytes_sent_by_phase": {p.value: b for p, b in bytes_by_phase(r.collectives).items()},
        "collectives": [c.to_dict() for c in r.collectives],
    }


def print_results(rows: list[dict], bound: int, minimum: int) -> None:
    print(
        f"{'':24}{'peak/device':>14}{'x bound':>9}{'sent/device/step':>18}{'sent/min':>10}{'TPU sent/min':>14}"
        f"{'step time':>11}{'x torch_xla':>13}"
    )
    for row in rows:
        tpu = row["tpu_sent_over_minimum"]
        print(
            f"{row['label']:24}{format_bytes(row['peak_bytes']):>14}{row['peak_over_bound']:>9.2f}"
            f"{format_bytes(row['bytes_sent_per_device']):>18}{row['sent_over_minimum']:>10.3f}"
            f"{'-' if tpu is None else f'{tpu:.3f}':>14}"
            f"{row['step_seconds'] * 1000:>9.0f}ms{row['step_time_over_torch_xla']:>13.3f}"
        )
    print(f"{'ZeRO-3 bound':24}{format_bytes(bound):>14}{1.0:>9.2f}{format_bytes(minimum):>18}{1.0:>10.3f}")
    for row in rows:
        tpu = row["tpu"] or {}
        if "error" in tpu:
            print(f"  {row['label']}: no TPU compile ({tpu['error']})")
        elif tpu:
            kinds = ", ".join(f"{k} {format_bytes(b)}" for k, b in sorted(tpu["bytes_sent_by_kind"].items()))
            print(f"  {row['label']}, compiled by libtpu for {tpu['slice']}: {kinds}")


def _kinds(counts: Counter) -> str:
    return ", ".join(f"{n} {k.value}" for k, n in sorted(counts.items(), key=lambda kv: kv[0].value)) or "-"


def print_phases(result: Result, param_bytes: int, devices: int) -> None:
    """Per phase, then per unit: the collectives and bytes of ``result``'s step."""
    per_phase = param_bytes * (devices - 1) // devices  # each FSDP phase's share of the minimum
    sent = bytes_by_phase(result.collectives)
    print(f"\n{NAMES[result.name] + ', by phase':34}{'collectives':>30}{'sent/device':>14}{'x P(N-1)/N':>12}")
    for phase in Phase:
        kinds = Counter(c.kind for c in result.collectives if c.phase is phase)
        share = f"{sent[phase] / per_phase:.3f}" if phase is not Phase.OTHER else ""
        print(f"  {phase.value:32}{_kinds(kinds):>30}{format_bytes(sent[phase]):>14}{share:>12}")
    fsdp_phases = [p for p in Phase if p is not Phase.OTHER]
    print(f"  {'unit':12}" + "".join(f"{p.value:>24}" for p in fsdp_phases))
    for unit, phases in counts_by_unit(result.collectives).items():
        if unit is not None:
            print(f"  {unit or '(root)':12}" + "".join(f"{_kinds(phases.get(p, Counter())):>24}" for p in fsdp_phases))


def write_json(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(path)
    print(f"\nJSON: {path}")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    spmd.enable_spmd()
    # fp32 matmuls in the traced HLO (XLA:CPU computes them so anyway): at TPU's default
    # precision libtpu gathers the weights that feed matmuls in bf16, and the TPU column would
    # compare half-size gathers with the fp32 minimum.
    torch_xla.backends.set_mat_mul_precision("highest")
    n = xr.global_runtime_device_count()
    mesh = Mesh(np.arange(n), (n,), ("fsdp",))
    config = dict(vocab=args.vocab, d_model=args.d_model, n_head=args.heads, n_layer=args.layers, seq=args.seq)
    reference = GPT(**config)
    n_params = sum(p.numel() for p in reference.parameters())
    unit_params = sum(p.numel() for p in reference.h[0].parameters())
    root_params = n_params - args.layers * unit_params
    del reference

    prepared = [prepare(k, config, mesh, args.batch, args.warmup) for k in tqdm(NAMES, desc="configurations")]
    times = time_interleaved(prepared, args.steps)
    results = [result(p, times[p.kind], n, tpu=not args.no_tpu) for p in prepared]
    ours = next(r for r in results if r.name == "fsdp_xla")
    assert ours.forward_backward_peak is not None
    activations = activation_bytes(config, mesh, args.batch, ours.forward_backward_peak)
    states = 16 * n_params // n
    largest_unit = 4 * max(unit_params, root_params)
    bound = states + largest_unit + activations
    minimum = zero3_minimum_bytes(4 * n_params, n)

    print(
        f"\nGPT {config}: {n_params:,} parameters, {args.layers} blocks of {unit_params:,}; batch {args.batch}; {n} devices"
    )
    print(
        f"ZeRO-3 bound per device: states 16P/N {format_bytes(states)} + one unit {format_bytes(largest_unit)} "
        f"+ activations {format_bytes(activations)} = {format_bytes(bound)}"
    )
    print(f"ZeRO-3 minimum sent per device per step: 3P(N-1)/N = {format_bytes(minimum)}\n")
    rows = [result_row(r, bound, minimum, results[0]) for r in results]
    print_results(rows, bound, minimum)
    for r in results[1:]:
        print_phases(r, 4 * n_params, n)
    out = {
        "config": config,
        "batch": args.batch,
        "devices": n,
        "platform": xr.device_type(),
        "parameters": n_params,
        "unit_parameters": unit_params,
        "bound_bytes": {"states": states, "largest_unit": largest_unit, "activations": activations, "total": bound},
        "minimum_bytes_sent_per_device": minimum,
        "results": rows,
    }
    write_json(args.json, out)
    return out


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    main()
