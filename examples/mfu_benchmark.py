"""MFU benchmark: one model under several sharding strategies, FLOPs counted three ways.

    torchrun --nproc_per_node 4 examples/mfu_benchmark.py    # DTensor: fsdp against FSDP2's fully_shard
    python examples/mfu_benchmark.py                         # torch_xla: small GPT-2, 8 virtual CPU devices, ~2 min
                                                             # (without torch_xla: launches 4 DTensor ranks)
    python examples/mfu_benchmark.py --model gpt2 --batch 64 --seq 1024 --strategies fsdp,2d,dp
    PJRT_DEVICE=TPU python examples/mfu_benchmark.py --model gpt2-xl --batch 256 --seq 1024

Strategies (all through fsdp_xla / spmd):
- ``fsdp``: parameters sharded on an ``fsdp`` axis of all devices, one unit per block;
- ``2d``:   fsdp x tensor (mesh ``(n / t, t)``, ``--tensor t``), the GPT-2 / Llama sharding plan;
- ``dp``:   parameters replicated, the batch split over all devices.
``--baseline torch_xla`` adds torch_xla's ``SpmdFullyShardedDataParallel`` on the same model
and mesh as ``fsdp``; each strategy's step time is also given as a ratio to it.

Reported per strategy: step time (median and min-max over the timed steps; compile and
warm-up excluded), tokens/s, TFLOP/s per device, MFU under the blogs' 6N, PaLM's
6N + 12LHQT and a per-matmul count (see spmd.mfu), and per-device peak memory from XLA's
buffer assignment (spmd.inspector). MFU divides by chips x peak FLOP/s per chip: detected
from the TPU's device kind, ``--peak-tflops`` to override, and on the CPU this machine's
measured float32 matmul peak, so there MFU means "fraction of what this machine can do".
Writes JSON and a plot beside it.

On the dtensor backend (the default under torchrun and where torch_xla is not installed; one
process per device) ``fsdp`` runs through it (torch's ``fully_shard`` per unit); each process
trains on its part of the batch, and rank 0 prints and writes. The baseline there is FSDP2
itself, ``fully_shard`` applied by hand to each block and the root (``--baseline
fully_shard``), measured in the same run. ``2d`` and ``dp`` are torch_xla only (tensor
parallelism on DTensor needs torch's ``parallelize_module``, which our FSDP does not apply).
torch_xla's FSDPv2 and XLA's buffer assignment (the peak memory column) need torch_xla: the
run says in one line that it skips them. On CPU the peak is the same measured matmul peak (all
threads, measured by rank 0 alone).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path

from spmd import configure_default_devices

configure_default_devices()

try:
    from examples import _lane  # the repository is on the path (tests, PYTHONPATH)
except ImportError:
    import _lane  # run as a script: examples/ is on the path

import spmd.inspector as inspector  # noqa: E402

inspector.prepare()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,  # noqa: E402
    GPT2Config,
    LlamaConfig,
)

import spmd  # noqa: E402
from fsdp_xla import FSDP, transformer_auto_wrap_policy  # noqa: E402
from fsdp_xla.hf import gpt2_plan, llama_plan  # noqa: E402
from mesh import Mesh  # noqa: E402
from spmd import P, mark_sharding  # noqa: E402
from spmd.backend import torch_xla_backend as backend  # noqa: E402
from spmd.errors import INSTALL_TORCH_XLA  # noqa: E402
from spmd.mfu import (  # noqa: E402
    TransformerShape,
    chip_for_device_kind,
    matmul_flops_per_token,
    measure_cpu_peak_flops,
    mfu,
    palm_flops_per_token,
    six_n_flops_per_token,
)

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "gpt2-tiny": dict(model_type="gpt2", n_embd=256, n_layer=4, n_head=4, vocab_size=8192),
    "gpt2": dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257),
    "gpt2-medium": dict(model_type="gpt2", n_embd=1024, n_layer=24, n_head=16, vocab_size=50257),
    "gpt2-large": dict(model_type="gpt2", n_embd=1280, n_layer=36, n_head=20, vocab_size=50257),
    "gpt2-xl": dict(model_type="gpt2", n_embd=1600, n_layer=48, n_head=25, vocab_size=50257),
    "llama-tiny": dict(
        model_type="llama",
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=8192,
    ),
    "llama2-7b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
    ),
}


def make_config(name: str | None, config_path: Path | None, seq: int):
    if config_path is not None:
        config = AutoConfig.from_pretrained(str(config_path))  # a config.json, no weights
    else:
        spec = dict(MODELS[name])
        model_type = spec.pop("model_type")
        if model_type == "gpt2":
            last = spec["vocab_size"] - 1  # GPT-2's 50256 special token, inside a smaller vocabulary
            config = GPT2Config(
                **spec,
                n_positions=seq,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=last,
                eos_token_id=last,
            )
        else:
            config = LlamaConfig(**spec, max_position_embeddings=seq)
    config.use_cache = False
    return config


def block_class(model: torch.nn.Module) -> type:
    names = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in names:
            return type(module)
    raise ValueError(f"{type(model).__name__} names no transformer block in _no_split_modules.")


def build(strategy: str, config, n: int, tensor: int):
    """(model, mesh, batch spec) for a strategy, from the same seed."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    plan = gpt2_plan() if config.model_type == "gpt2" else llama_plan()
    if strategy == "fsdp":
        mesh = Mesh(np.arange(n), (n,), ("fsdp",))
        model = FSDP(model, mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({block_class(model)}))
        return model, mesh, P("fsdp", None)
    if strategy == "2d":
        if n % tensor:
            raise ValueError(f"--tensor {tensor} does not divide the {n} devices.")
        mesh = Mesh(np.arange(n), (n // tensor, tensor), ("fsdp", "tensor"))
        model = FSDP(
            model,
            mesh=mesh,
            auto_wrap_policy=transformer_auto_wrap_policy({block_class(model)}),
            param_spec_fn=plan.param_spec_fn(mesh),
        )
        return model, mesh, P("fsdp", None)
    if strategy == "dp":
        import torch_xla

        mesh = Mesh(np.arange(n), (n,), ("data",))
        model = model.to(torch_xla.device())
        model.tie_weights()  # .to() unties the embeddings
        spmd.use_shardable_layer_norm(model)
        return model, mesh, P("data", None)
    if strategy == "torch_xla":
        import torch_xla.distributed.spmd as xs
        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy as xla_policy
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        mesh = Mesh(np.arange(n), (n,), ("fsdp",))
        xla_mesh = xs.Mesh(np.arange(n), (n,), ("fsdp",))

        def shard_output(output, mesh):  # what the HF Trainer passes for its FSDPv2 path
            real = output.logits if hasattr(output, "logits") else (output[0] if isinstance(output, tuple) else output)
            if isinstance(real, torch.Tensor) and real.dim() >= 1:
                xs.mark_sharding(real, mesh, ("fsdp",) + (None,) * (real.dim() - 1))

        policy = functools.partial(xla_policy, transformer_layer_cls={block_class(model)})
        wrapped = SpmdFullyShardedDataParallel(model, mesh=xla_mesh, auto_wrap_policy=policy, shard_output=shard_output)
        if hasattr(wrapped.module, "tie_weights"):
            wrapped.module.tie_weights()
        return wrapped, mesh, P("fsdp", None)
    if strategy == "fully_shard":  # FSDP2 by hand, the dtensor backend's peer: no fsdp_xla, no spmd
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = Mesh(np.arange(n), (n,), ("fsdp",))
        device_mesh = init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", (n,), mesh_dim_names=("fsdp",))
        blocks = [m for m in model.modules() if isinstance(m, block_class(model))]
        for block in blocks:
            fully_shard(block, mesh=device_mesh)
        fully_shard(model, mesh=device_mesh)
        return model, mesh, P("fsdp", None)
    raise ValueError(f"Unknown strategy {strategy!r}; choose from fsdp, 2d, dp (and --baseline torch_xla).")


def run(strategy: str, config, args, n: int, progress) -> dict:
    model, mesh, batch_spec = build(strategy, config, n, args.tensor)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    on_dtensor = spmd.backend_for().name == "dtensor"
    if not on_dtensor:  # torch_xla only here: the dtensor path runs where it is not installed
        import torch_xla
        import torch_xla.core.xla_model as xm

    def step() -> torch.Tensor:
        tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=gen)
        if on_dtensor:  # each process trains on its part of the batch (FSDP averages gradients)
            tokens = tokens.chunk(n)[torch.distributed.get_rank()]
        else:
            tokens = tokens.to(torch_xla.device())
            mark_sharding(tokens, mesh, batch_spec)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if not on_dtensor:
            torch_xla.sync()
        return loss.detach()

    def wait() -> None:
        if on_dtensor:
            torch.distributed.barrier()
        else:
            xm.wait_device_ops()

    ignore = ["parameter-all-gather", "replicated-argument", "replicated-activation"]
    with contextlib.nullcontext() if on_dtensor else inspector.capture(ignore=ignore) as report:
        for _ in progress(range(args.warmup), desc=f"{strategy:>9} compile + warm-up"):
            step()
        wait()
    times = []
    for _ in progress(range(args.steps), desc=f"{strategy:>9}"):
        started = time.perf_counter()
        step()
        wait()
        times.append(time.perf_counter() - started)
    graphs = [] if report is None else report.report.graphs
    return {
        "strategy": strategy,
        "mesh": dict(mesh.shape()),
        "step_seconds": statistics.median(times),
        "step_seconds_min": min(times),
        "step_seconds_max": max(times),
        "peak_bytes_per_device": max((g.memory.peak_bytes for g in graphs if g.memory), default=None),
    }


def start_dtensor() -> tuple[int, str, int]:
    """(processes, platform, rank) of a torchrun job, with the dtensor backend chosen."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    spmd.use_backend("dtensor")
    return dist.get_world_size(), "GPU" if torch.cuda.is_available() else "CPU", dist.get_rank()


def cpu_peak_on_rank0() -> float:
    """This machine's matmul peak with all its threads, measured by rank 0 while the others wait
    (torchrun gives each process one thread, and four at once would share the cores)."""
    import torch.distributed as dist

    peak = torch.zeros(1, dtype=torch.float64)
    if dist.get_rank() == 0:
        threads = torch.get_num_threads()
        torch.set_num_threads(os.cpu_count() or 1)
        peak[0] = measure_cpu_peak_flops()
        torch.set_num_threads(threads)
    dist.broadcast(peak, 0)
    return float(peak[0])


def skipped_without_torch_xla() -> str:
    """What a dtensor run leaves out, and why, in one line."""
    what = "torch_xla's FSDPv2 baseline and XLA's per-device peak memory"
    if importlib.util.find_spec("torch_xla") is None:
        return f"{what} need torch_xla: {INSTALL_TORCH_XLA}. The 2d and dp strategies run there only."
    return f"{what}, 2d and dp: they run on the torch_xla backend (without torchrun and --backend dtensor)."


def progress_bar():
    try:
        from tqdm import tqdm

        return tqdm
    except ImportError:  # pragma: no cover
        return lambda it, desc="": it


def plot(rows: list[dict], path: Path, peak_label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["strategy"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(names, [r["step_seconds"] for r in rows], color="#4c72b0")
    a.errorbar(
        names,
        [r["step_seconds"] for r in rows],
        yerr=[
            [r["step_seconds"] - r["step_seconds_min"] for r in rows],
            [r["step_seconds_max"] - r["step_seconds"] for r in rows],
        ],
        fmt="none",
        color="black",
    )
    a.set_ylabel("step time (s), median, min-max")
    width = 0.27
    x = np.arange(len(names))
    for i, key in enumerate(("mfu_6n", "mfu_palm", "mfu_matmul")):
        b.bar(x + (i - 1) * width, [100 * r[key] for r in rows], width, label=key.removeprefix("mfu_"))
    b.set_xticks(x, names)
    b.set_ylabel("MFU (%)")
    b.set_title(f"of {peak_label}", fontsize=8)
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    parser = _lane.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-tiny", choices=sorted(MODELS))
    parser.add_argument("--config", type=Path, default=None, help="a Hugging Face config.json (gpt2 or llama)")
    parser.add_argument(
        "--strategies", default=None, help="comma list of fsdp, 2d, dp (default fsdp,2d; on dtensor fsdp only)"
    )
    parser.add_argument(
        "--baseline",
        default=None,
        choices=["torch_xla", "fully_shard", "none"],
        help="default: torch_xla's FSDPv2 on torch_xla, FSDP2's fully_shard on dtensor",
    )
    parser.add_argument("--tensor", type=_lane.at_least(1), default=2, help="size of the tensor axis for 2d")
    parser.add_argument("--batch", type=_lane.at_least(1), default=16, help="global batch (sequences)")
    parser.add_argument("--seq", type=_lane.at_least(1), default=128)
    parser.add_argument("--steps", type=_lane.at_least(1), default=5, help="timed steps")
    parser.add_argument("--warmup", type=_lane.at_least(0), default=2, help="steps before timing (they compile)")
    parser.add_argument("--peak-tflops", type=_lane.positive_float, default=None, help="peak TFLOP/s per chip")
    parser.add_argument(
        "--chips", type=_lane.positive_float, default=None, help="chips (default: devices / devices per chip)"
    )
    parser.add_argument("--json", type=_lane.output_file, default=Path("runs") / "mfu_benchmark.json")
    parser.add_argument(
        "--backend", choices=["torch_xla", "dtensor"], help="default: dtensor under torchrun or without torch_xla"
    )
    args = parser.parse_args(argv)
    check_args(args, parser)
    args.backend = _lane.settle_backend(args.backend, __file__, argv)
    return args, parser


STRATEGIES = ("fsdp", "2d", "dp")


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """What the flags' types cannot see, before any rank starts: one line, not one per rank (with
    torchrun's traceback) once each has built its model."""
    unknown = sorted(set(filter(None, (args.strategies or "").split(","))) - set(STRATEGIES))
    if unknown:
        parser.error(f"--strategies {args.strategies}: unknown {unknown}; give a comma list of {', '.join(STRATEGIES)}")
    if (args.backend or _lane.default_backend()) == "dtensor":
        if args.baseline == "torch_xla":
            parser.error("--baseline torch_xla runs on torch_xla only; on dtensor the baseline is fully_shard")
        if set(filter(None, (args.strategies or "").split(","))) - {"fsdp"}:
            parser.error(
                f"--strategies {args.strategies}: only fsdp runs on dtensor here (2d and dp need torch's "
                "parallelize_module and DDP, which this benchmark does not apply); use --strategies fsdp"
            )
    elif args.baseline == "fully_shard":
        parser.error("--baseline fully_shard runs on dtensor only (torchrun, or --backend dtensor)")
    if args.config is not None:
        if not args.config.is_file():
            parser.error(f"--config {args.config} is not a file; give a Hugging Face config.json (gpt2 or llama)")
        try:
            TransformerShape.from_hf_config(make_config(None, args.config, args.seq))
        except Exception as e:  # transformers' and huggingface_hub's own errors for a file it cannot read
            parser.error(f"--config {args.config}: {str(e).strip().splitlines()[0][:300]}")


def start_lane(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[int, str, int]:
    """Settle the lane's defaults (strategies, baseline) and start its runtime: (devices, platform, rank)."""
    if args.backend == "dtensor":  # under torchrun: one process per device
        if args.baseline == "torch_xla":
            parser.error("--baseline torch_xla runs on torch_xla only; on dtensor the baseline is fully_shard")
        args.baseline = args.baseline or "fully_shard"
        args.strategies = args.strategies or "fsdp"
        if set(args.strategies.split(",")) - {"fsdp", ""}:
            parser.error(
                f"--strategies {args.strategies}: only fsdp runs on dtensor here (2d and dp need torch's "
                "parallelize_module and DDP, which this benchmark does not apply); use --strategies fsdp"
            )
        return start_dtensor()
    if args.baseline == "fully_shard":
        parser.error("--baseline fully_shard runs on dtensor only (torchrun, or --backend dtensor)")
    args.baseline = args.baseline or "torch_xla"
    args.strategies = args.strategies or "fsdp,2d"
    import torch_xla.runtime as xr

    spmd.enable_spmd()
    n = xr.global_runtime_device_count()
    if "2d" in args.strategies.split(",") and n % args.tensor:
        parser.error(f"--tensor {args.tensor} does not divide the {n} devices (the 2d strategy's mesh)")
    return n, xr.device_type(), 0


def peak_for(args: argparse.Namespace, parser: argparse.ArgumentParser, platform: str, n: int):
    """(peak FLOP/s per chip, chips, label): the flag, this CPU's measured peak, or the TPU table."""
    if args.peak_tflops is not None:
        return args.peak_tflops * 1e12, args.chips or n, f"{args.peak_tflops:g} TFLOP/s per chip"
    if platform == "GPU":
        parser.error("no peak FLOP/s table for GPUs here; pass --peak-tflops")
    if platform == "CPU":
        peak = cpu_peak_on_rank0() if args.backend == "dtensor" else measure_cpu_peak_flops()
        return peak, args.chips or 1, f"this CPU's measured fp32 matmul peak, {peak / 1e9:.1f} GFLOP/s"
    chip = chip_for_device_kind(backend.device_kind())
    return (
        chip.peak_flops,
        args.chips or n / chip.devices_per_chip,
        f"{chip.name} {chip.peak_flops / 1e12:g} TFLOP/s per chip",
    )


def measure(strategies: list[str], config, args, n: int, bar, tokens: int, flops: dict, chips, peak) -> list[dict]:
    """One row per strategy: step time, throughput and MFU by each FLOP count, and the ratio to the baseline."""
    rows = []
    for s in strategies:
        row = run(s, config, args, n, bar)
        t = row["step_seconds"]
        row.update(
            tokens_per_second=tokens / t,
            tflops_per_device=flops["matmul"] / t / n / 1e12,
            mfu_6n=mfu(flops["6n"], t, chips, peak),
            mfu_palm=mfu(flops["palm"], t, chips, peak),
            mfu_matmul=mfu(flops["matmul"], t, chips, peak),
        )
        rows.append(row)
    base = next((r for r in rows if r["strategy"] == args.baseline), None)
    for r in rows:
        r[f"step_time_over_{args.baseline}"] = r["step_seconds"] / base["step_seconds"] if base else None
    return rows


def print_table(rows: list[dict], baseline: str, say) -> None:
    ratio_key = f"step_time_over_{baseline}"
    say()
    say(
        f"{'strategy':>12}{'mesh':>20}{'step (s)':>10}{'min-max':>14}{'tokens/s':>10}{'TFLOP/s/dev':>12}"
        f"{'MFU 6N':>8}{'PaLM':>7}{'matmul':>8}{'peak/dev':>11}{'x ' + baseline:>14}"
    )
    for r in rows:
        mesh_text = "x".join(f"{k}{v}" for k, v in r["mesh"].items())
        ratio = f"{r[ratio_key]:.3f}" if r[ratio_key] else "-"
        mem = f"{r['peak_bytes_per_device'] / 2**20:.1f}MiB" if r["peak_bytes_per_device"] else "-"
        say(
            f"{r['strategy']:>12}{mesh_text:>20}{r['step_seconds']:>10.3f}"
            f"{r['step_seconds_min']:>7.3f}-{r['step_seconds_max']:<6.3f}{r['tokens_per_second']:>10.0f}"
            f"{r['tflops_per_device']:>12.4f}{100 * r['mfu_6n']:>7.1f}%{100 * r['mfu_palm']:>6.1f}%"
            f"{100 * r['mfu_matmul']:>7.1f}%{mem:>11}{ratio:>14}"
        )


def write_outputs(out: dict, rows: list[dict], path: Path, peak_label: str, say) -> None:
    """The JSON (atomically) and the plot beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(path)
    png = path.with_suffix(".png")
    plot(rows, png, peak_label)
    say(f"\nJSON: {path}\nplot: {png}")


def main(argv: list[str] | None = None) -> dict:
    args, parser = parse_args(argv)
    n, platform, rank = start_lane(args, parser)
    say = print if rank == 0 else (lambda *a, **k: None)
    config = make_config(args.model, args.config, args.seq)
    shape = TransformerShape.from_hf_config(config)
    tokens = args.batch * args.seq
    flops = {
        "6n": six_n_flops_per_token(shape.n_params) * tokens,
        "palm": palm_flops_per_token(shape, args.seq) * tokens,
        "matmul": matmul_flops_per_token(shape, args.seq) * tokens,
    }
    peak, chips, peak_label = peak_for(args, parser, platform, n)
    strategies = [s for s in args.strategies.split(",") if s]
    if args.baseline != "none":
        strategies.append(args.baseline)
    say(
        f"{config.model_type} {args.model if args.config is None else args.config}: {shape.n_params:,} parameters; "
        f"batch {args.batch} x seq {args.seq} = {tokens:,} tokens/step; {n} {platform} "
        f"{'processes' if args.backend == 'dtensor' else 'devices'}; peak: {peak_label}"
    )
    if args.backend == "dtensor":
        say(f"skipped: {skipped_without_torch_xla()}")
    bar = progress_bar() if rank == 0 else (lambda it, desc="": it)
    rows = measure(strategies, config, args, n, bar, tokens, flops, chips, peak)
    print_table(rows, args.baseline, say)
    out = {
        "backend": args.backend,
        "model": args.model if args.config is None else str(args.config),
        "parameters": shape.n_params,
        "batch": args.batch,
        "seq": args.seq,
        "devices": n,
        "platform": platform,
        "chips": chips,
        "peak_flops_per_chip": peak,
        "peak": peak_label,
        "flops_per_step": flops,
        "baseline": None if args.baseline == "none" else args.baseline,
        "results": rows,
    }
    if rank == 0:
        write_outputs(out, rows, args.json, peak_label, say)
    return out


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    main()
