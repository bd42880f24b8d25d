"""Each rank's host memory while FSDPTrainer builds and wraps a GPT-2 on DTensor (torchrun, gloo):
deferred init against eager init, next to the unsharded model's size.

    python benchmarks/hf_trainer_memory.py                 # 4 ranks, ~134 M parameters (0.50 GiB fp32)
    python benchmarks/hf_trainer_memory.py --nproc 2 --n-embd 512 --n-layer 4

Each way is one ``torchrun`` launch of ``examples/hf_trainer_fsdp.py`` (the blog's
fsdp_config.json) with 1 training step, so the numbers are the trainer's construction: peak RSS
per rank (``ru_maxrss``) once the trainer is built, before training. That includes the Python,
torch and transformers baseline, measured alone in each rank first (``baseline``).

- deferred: ``fsdp_xla.deferred_init(AutoModelForCausalLM.from_config, config)``; each rank
  initializes only its shards, a slab of rows at a time (fsdp_xla._shard_init);
- eager: ``AutoModelForCausalLM.from_config(config)``: every rank builds and initializes the
  whole model, then shards it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hf_trainer_fsdp.py"


def launch(nproc: int, args: list[str], out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_"))}
    env.update(PYTHONPATH=str(ROOT), USE_TORCH_XLA="0")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    command += [str(EXAMPLE), *args, "--steps", "1", "--output-dir", str(out.parent / out.stem), "--json", str(out)]
    subprocess.run(command, env=env, check=True, cwd=out.parent, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def baseline_rss() -> int:
    """Peak RSS of a process that imports what a rank imports and builds nothing."""
    code = (
        "import resource, torch, transformers, fsdp_xla.hf.trainer;"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), USE_TORCH_XLA="0")
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=at_least(1), default=4)
    parser.add_argument("--n-embd", type=at_least(1), default=1024)
    parser.add_argument("--n-layer", type=at_least(1), default=8)
    parser.add_argument("--vocab", type=at_least(2), default=32000)
    args = parser.parse_args(argv)
    model = ["--n-embd", str(args.n_embd), "--n-layer", str(args.n_layer), "--vocab", str(args.vocab)]
    model += ["--n-head", "16", "--batch", str(4 * args.nproc), "--seq", "128"]
    base = baseline_rss()
    gib = 2**30
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "deferred": launch(args.nproc, model, Path(tmp) / "deferred.json"),
            "eager": launch(args.nproc, [*model, "--eager-init"], Path(tmp) / "eager.json"),
        }
    size = runs["deferred"]["model_bytes"]
    print(f"unsharded model: {size / gib:.3f} GiB (float32); baseline per process (imports): {base / gib:.2f} GiB")
    print(f"{'init':10} {'peak RSS per rank, building the trainer (GiB)':48} {'above baseline / model size':>28}")
    for name, run in runs.items():
        per_rank = run["built_rss_bytes"]
        ratios = ", ".join(f"{(r - base) / size:.2f}" for r in per_rank)
        print(f"{name:10} {', '.join(f'{r / gib:.2f}' for r in per_rank):48} {ratios:>28}")


if __name__ == "__main__":
    main()
