"""Context parallelism on 4 gloo ranks: tokens per second, per-rank peak memory and bytes sent per
step, at 4K to 32K tokens, CP 1 (the same model without CP: fsdp 4), CP 2 (fsdp 2 x context 2) and
CP 4 (context 4), at the same global batch.

- tokens/s: the real 4-rank job (examples/train_long_context.py's model and step), the median of
  ``--steps`` timed steps after one warm-up, all arms interleaved sequence length by length.
- peak memory and bytes sent: the dry run of the same job (``python -m spmd.inspector --world 4
  --json``), the runtime's own record: per-rank peak and every collective with its group. Bytes
  sent are the ring volume each rank sends (`ring_bytes_sent`); the context axis's share is held
  to the strategy's minimum: K and V gathered once per layer in forward and their gradients
  reduce-scattered once in backward, each rank sending ``(context - 1) / context`` of the
  gathered ``[batch, kv_heads, seq, head_dim]`` per tensor.
- torch's ``context_parallel`` beside ours: tried on every arm with a context axis; on this CPU it
  does not run (its ring handlers cover CUDA's kernels), and the table says so with its error.

With torch_xla installed (the torch_xla lane) it measures the compiled step instead: the same
model on 8 XLA devices (CP 1: fsdp 8; CP c: fsdp 8/c x context c; global batch 8), per-device peak
memory and bytes sent from XLA's own reports of the compiled program (``python -m
spmd.inspector --json``), attention's all-gathers over the context axis against the K/V gathers' minimum, and the context
axis's other all-gathers (the embedding's backward: torch_xla flattens its tokens, once a step). GSPMD
runs dot attention (a ``[queries, keys]`` matrix per shard), so ``--seqs`` stays shorter there.

    python benchmarks/context_parallel.py [--seqs 4096,8192,16384,32768] [--steps 3] [--json out.json]
    python benchmarks/context_parallel.py --seqs 1024,2048,4096 --json out.json   # torch_xla lane

Prints one table and writes the JSON (``--json``). Long: at 32K tokens a CP 1 step takes minutes
on 2 cores; shorten with ``--seqs``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS, D_MODEL, HEADS, KV_HEADS = 2, 128, 4, 2
MODEL = ["--layers", str(LAYERS), "--d-model", str(D_MODEL), "--heads", str(HEADS), "--kv-heads", str(KV_HEADS)]
MODEL += ["--vocab", "256"]
ARMS = {1: "fsdp 4 (no CP)", 2: "fsdp 2 x context 2", 4: "context 4"}
BATCH = 4  # global batch: one sequence per rank without CP
XLA_DEVICES, XLA_BATCH = 8, 8  # the torch_xla lane's compiled step


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM"))}
    env.update(PYTHONPATH=str(ROOT), USE_TORCH_XLA="0")
    return env


def _json_of(command: list[str], out: Path, env: dict[str, str]) -> dict:
    """Run ``command``; the JSON it wrote to ``out``, or ``{"error": its last stderr line}``."""
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"}
    return json.loads(out.read_text())


def _gathered_kv_bytes(rows: int, seq: int) -> int:
    """One layer's K (or V) gathered whole along the sequence: ``[rows, kv_heads, seq, head_dim]``, float32."""
    return rows * KV_HEADS * seq * (D_MODEL // HEADS) * 4


def timed_run(context: int, seq: int, steps: int) -> dict:
    """The real 4-rank job: per-step seconds (rank 0's, after a barrier) and the losses."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4"]
        command += [__file__, "--worker", "--context", str(context), "--seq", str(seq), "--steps", str(steps)]
        command += ["--out", str(out)]
        return _json_of(command, out, _env())


def dry_run(context: int, seq: int) -> dict:
    """Peak memory and collectives of one step from the dry run of rank 0 of 4."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "spmd.inspector", "--world", "4", "--steps", "1", "--json", str(report)]
        command += [str(ROOT / "examples" / "train_long_context.py"), "--backend", "dtensor", "--steps", "1"]
        command += ["--seq", str(seq), "--context", str(context), "--batch", str(BATCH), *MODEL]
        return _json_of(command, report, _env())


def context_minimum(context: int, seq: int) -> int:
    """Bytes each rank must send per step over the context axis (module docstring): 2 layers x
    K and V x (gather + gradient reduce-scatter) x (c - 1) / c of the gathered tensor, float32."""
    rows = BATCH * context // 4  # each rank's rows: the batch split over fsdp = 4 / context
    return LAYERS * 2 * 2 * _gathered_kv_bytes(rows, seq) * (context - 1) // context


def worker(context: int, seq: int, steps: int, out: Path) -> None:
    import torch.distributed as dist

    from examples import train_long_context as example

    argv = ["--backend", "dtensor", "--context", str(context), "--seq", str(seq), "--batch", str(BATCH), *MODEL]
    args = example.parse_args(argv)
    devices, rank = example.start_runtime("dtensor")
    dims = example.ParallelDims.for_world(devices, context=context)
    model, plan, optimizer = example.build(args, dims)
    times, losses = [], []
    for step in range(steps + 1):
        tokens = example.synthetic_tokens(step, BATCH, seq, args.vocab)
        dist.barrier()
        started = time.perf_counter()
        loss = example.train_step(model, example.split_batch(plan, dims, tokens), optimizer)
        dist.barrier()
        if step:  # the first step warms up
            times.append(time.perf_counter() - started)
        losses.append(example.global_loss(loss, "dtensor"))
    torch_cp = _torch_context_parallel(dims, seq) if context > 1 else None
    if rank == 0:
        out.write_text(json.dumps({"seconds": times, "losses": losses, "torch_context_parallel": torch_cp}))
    dist.destroy_process_group()


def _torch_context_parallel(dims, seq: int) -> str:  # noqa: ANN001
    """torch's ``context_parallel`` on one causal attention of this arm's shape: "ran", or why not."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel

    import spmd

    mesh = spmd.device_mesh(dims.mesh())["context"]
    q = torch.randn(1, 4, seq, 32)
    try:
        with context_parallel(mesh, buffers=[q], buffer_seq_dims=[2]):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
    except Exception as e:  # what torch raises on this device is the finding
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return "ran"


def context_group_of_rank_0(context: int) -> list[int]:
    """The ranks rank 0 shares its context axis with on this arm's mesh."""
    from mesh import ParallelDims

    mesh = ParallelDims.for_world(4, context=context).mesh()
    ids = mesh.get_logical_mesh()
    axis = mesh.axis_index("context")
    index = [int(i[0]) for i in (ids == 0).nonzero()]
    index[axis] = slice(None)
    return sorted(int(r) for r in ids[tuple(index)].ravel())


def bytes_sent(step: dict, context: int) -> tuple[int, int]:
    """(all bytes rank 0 sends in the step, those of attention over its context group).

    At context 4 on 4 ranks FSDP's group is the context group too; FSDP gathers whole blocks
    (``layers.i``), context parallelism gathers inside attention (``layers.i.attn``)."""
    group = context_group_of_rank_0(context) if context > 1 else None
    total = sum(c["bytes_sent"] for c in step["collectives"])
    over_context = sum(
        c["bytes_sent"] for c in step["collectives"] if c["ranks"] == group and c["module"].endswith(".attn")
    )
    return total, over_context


def compiled_step(context: int, seq: int) -> dict:
    """XLA's report of the example's compiled training step on 8 devices (the inspector's JSON)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "spmd.inspector", "--steps", "1", "--json", str(report)]
        command += [str(ROOT / "examples" / "train_long_context.py"), "--backend", "torch_xla", "--steps", "2"]
        command += ["--seq", str(seq), "--context", str(context), "--batch", str(XLA_BATCH), *MODEL]
        env = {**_env(), "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(XLA_DEVICES)}
        env.pop("USE_TORCH_XLA")
        return _json_of(command, report, env)


def kv_gather_minimum(context: int, seq: int) -> int:
    """Bytes each device sends gathering K and V over the context axis in one forward: 2 layers x
    K and V x (c - 1) / c of ``[rows, kv_heads, seq, head_dim]``, float32, rows = c of the 8."""
    rows = XLA_BATCH // (XLA_DEVICES // context)
    return LAYERS * 2 * _gathered_kv_bytes(rows, seq) * (context - 1) // context


def compiled_steps(seqs: list[int], contexts: list[int], out: Path | None) -> None:
    rows = []
    print(
        f"{'seq':>6} {'arm':<22} {'peak/device':>13} {'sent/device':>13} {'K/V gathers':>15} {'x min':>10}"
        f" {'other gathers':>15}"
    )
    for seq in seqs:
        for context in contexts:
            arm = f"fsdp {XLA_DEVICES // context}" + (f" x context {context}" if context > 1 else " (no CP)")
            report = compiled_step(context, seq)
            row = {"context": context, "arm": arm, "seq": seq, "backend": "torch_xla"}
            if "error" in report:
                row["error"] = report["error"]
                print(f"{seq:>6} {arm:<22} failed: {row['error']}", flush=True)
                rows.append(row)
                continue
            (step,) = [g for g in report["graphs"] if g["collectives"]] or report["graphs"][:1]
            over_context = [
                c for c in step["collectives"] if context > 1 and c["group_size"] == context and c["op"] == "all-gather"
            ]
            in_attention = sum(c["bytes_sent_per_device"] for c in over_context if ".attn" in (c["op_name"] or ""))
            row.update(
                peak_bytes=report["totals"]["peak_bytes_per_device"],
                bytes_sent=report["totals"]["bytes_sent_per_device"],
                attention_gather_bytes=in_attention,
                other_context_gather_bytes=sum(c["bytes_sent_per_device"] for c in over_context) - in_attention,
                kv_gather_minimum=kv_gather_minimum(context, seq),
            )
            versus = f"{in_attention / row['kv_gather_minimum']:.3f}x" if context > 1 else "-"
            print(
                f"{seq:>6} {arm:<22} {row['peak_bytes'] / 2**20:>9,.1f} MiB {row['bytes_sent'] / 2**20:>9,.2f} MiB"
                f" {in_attention / 2**20:>11,.2f} MiB {versus:>10} {row['other_context_gather_bytes'] / 2**20:>11,.2f} MiB",
                flush=True,
            )
            rows.append(row)
    if out:
        out.write_text(json.dumps(rows, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="4096,8192,16384,32768")
    parser.add_argument("--contexts", default="1,2,4")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--context", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.context, args.seq, args.steps, args.out)
    if importlib.util.find_spec("torch_xla") is not None:
        return compiled_steps(
            [int(s) for s in args.seqs.split(",")], [int(c) for c in args.contexts.split(",")], args.json
        )
    rows = []
    print(
        f"{'seq':>6} {'arm':<20} {'tokens/s':>10} {'x CP 1':>7} {'peak/rank':>13} {'sent/rank':>12} {'over context':>13}"
    )
    for seq in (int(s) for s in args.seqs.split(",")):
        baseline = None
        for context in (int(c) for c in args.contexts.split(",")):
            timed, dry = timed_run(context, seq, args.steps), dry_run(context, seq)
            rows.append(_row(context, seq, timed, dry))
            if context == 1:
                baseline = rows[-1].get("tokens_per_s")
            if baseline and "tokens_per_s" in rows[-1]:
                rows[-1]["tokens_per_s_vs_cp1"] = rows[-1]["tokens_per_s"] / baseline
            print(_line(rows[-1]), flush=True)
    outcomes = {row["torch_context_parallel"] for row in rows if row.get("torch_context_parallel")}
    for outcome in sorted(outcomes):
        print(f"torch's context_parallel on this device: {outcome}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def _row(context: int, seq: int, timed: dict, dry: dict) -> dict:
    row = {"context": context, "arm": ARMS.get(context, f"context {context}"), "seq": seq}
    if "error" in timed:
        row["error"] = timed["error"]
    else:
        row["tokens_per_s"] = BATCH * seq / statistics.median(timed["seconds"])
        row["losses"] = timed["losses"]
        row["torch_context_parallel"] = timed["torch_context_parallel"]
    if "error" in dry:
        row["dry_run_error"] = dry["error"]
    else:
        step = dry["ranks"][0]["steps"][0]
        row["peak_bytes"] = step["peak_bytes"]
        row["bytes_sent"], row["context_bytes_sent"] = bytes_sent(step, context)
        row["context_minimum"] = context_minimum(context, seq)
    return row


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['seq']:>6} {row['arm']:<20} failed: {row['error']}"
    versus = f"{row['tokens_per_s_vs_cp1']:.2f}x" if "tokens_per_s_vs_cp1" in row else "-"
    if "peak_bytes" not in row:
        return f"{row['seq']:>6} {row['arm']:<20} {row['tokens_per_s']:>10,.0f} {versus:>7}  dry run failed: {row['dry_run_error']}"
    minimum = row["context_minimum"]
    over_context = f"{row['context_bytes_sent'] / minimum:.3f}x min" if minimum else "-"
    return (
        f"{row['seq']:>6} {row['arm']:<20} {row['tokens_per_s']:>10,.0f} {versus:>7}"
        f" {row['peak_bytes'] / 2**20:>9,.1f} MiB {row['bytes_sent'] / 2**20:>8,.1f} MiB {over_context:>13}"
    )


if __name__ == "__main__":
    main()
