"""Train a GPT-2 built from a config through the Hugging Face Trainer with fsdp_xla, using the
PyTorch/XLA blog's ``fsdp_config.json`` unchanged: on torch_xla's GSPMD (8 virtual devices by
default), or on DTensor under torchrun (one process per device; gloo on CPU, tpu_dist on TorchTPU).

    python examples/hf_trainer_fsdp.py                     # torch_xla lane: small GPT-2, deferred init
    torchrun --nproc_per_node 4 examples/hf_trainer_fsdp.py  # current lane: FSDP2 fully_shard per block
    python examples/hf_trainer_fsdp.py --eager-init --steps 20
    python examples/hf_trainer_fsdp.py --fsdp-config examples/fsdp_config.json --n-layer 6

The same flags as the blog's run_clm.py (``--fsdp full_shard --fsdp_config fsdp_config.json``)
reach the Trainer through TrainingArguments; the only change to a plain Trainer script is
``FSDPTrainer`` in place of ``Trainer`` and, for models larger than host memory,
``fsdp_xla.deferred_init(AutoModelForCausalLM.from_config, config)``. ``--batch`` is the global
batch on both (``per_device_train_batch_size`` under SPMD); under torchrun each rank takes its
rows of it. No download: the data are synthetic token sequences made here (counting up by a
random stride, so the loss falls). ``--save-steps N`` checkpoints every N steps (the sharded
format on DTensor) and ``--resume-from DIR`` continues from one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path

try:
    from examples import _lane  # the repository is on the path (tests, PYTHONPATH)
except ImportError:
    import _lane  # run as a script: examples/ is on the path

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _lane.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsdp-config", default=str(HERE / "fsdp_config.json"))
    parser.add_argument("--steps", type=_lane.at_least(1), default=12)
    parser.add_argument(
        "--batch", type=_lane.at_least(1), default=16, help="global batch (per_device_train_batch_size under SPMD)"
    )
    parser.add_argument("--seq", type=_lane.at_least(1), default=64)
    parser.add_argument("--vocab", type=_lane.at_least(2), default=512)
    parser.add_argument("--n-embd", type=_lane.at_least(1), default=128)
    parser.add_argument("--n-layer", type=_lane.at_least(1), default=4)
    parser.add_argument("--n-head", type=_lane.at_least(1), default=4)
    parser.add_argument("--lr", type=_lane.positive_float, default=3e-3)
    parser.add_argument("--eager-init", action="store_true", help="build the model on the host first")
    parser.add_argument("--output-dir", type=_lane.output_dir, default=Path("runs/hf_trainer_fsdp"))
    parser.add_argument(
        "--save-steps", type=_lane.at_least(0), default=0, help="checkpoint every N steps (0: no checkpoints)"
    )
    parser.add_argument("--resume-from", default=None, help="a checkpoint directory to continue from")
    parser.add_argument(
        "--json", type=_lane.output_file, default=None, help="write the losses and memory numbers here (rank 0)"
    )
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse's types cannot see, checked before any rank starts (one line, not a traceback
    from each rank once each has built its model)."""
    if args.n_embd % args.n_head:
        parser.error(f"--n-head {args.n_head} must divide --n-embd {args.n_embd}")
    if not _lane.under_torchrun() and _lane.default_backend() == "dtensor" and args.batch % _lane.ranks_to_launch():
        parser.error(f"--batch {args.batch} does not split over the {_lane.ranks_to_launch()} ranks this launches")
    if args.resume_from is not None and not Path(args.resume_from).is_dir():
        parser.error(f"--resume-from {args.resume_from} is not a directory; give a checkpoint-N directory of a run")
    from fsdp_xla.hf import HFConfigError, read_fsdp_config

    try:
        read_fsdp_config(args.fsdp_config, warn=False)
    except HFConfigError as e:
        parser.error(f"--fsdp-config: {e}")


TORCHRUN = _lane.under_torchrun()
GSPMD = _lane.default_backend() == "torch_xla"  # one process drives every device
if not TORCHRUN and not GSPMD and __name__ == "__main__":
    # Without torch_xla this example runs on DTensor, one process per device: launch them.
    parse_args(sys.argv[1:])  # a bad flag ends here, not in every rank
    sys.exit(_lane.launch_ranks(__file__, sys.argv[1:]))
if GSPMD:
    from spmd import configure_default_devices

    configure_default_devices()

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config  # noqa: E402

import fsdp_xla  # noqa: E402
from fsdp_xla.hf import FSDPTrainer, TrainingArguments  # noqa: E402

if GSPMD:
    import spmd

    spmd.enable_spmd()  # before TrainingArguments: it picks the XLA device


class CountingDataset(torch.utils.data.Dataset):
    """Sequences ``start, start + s, start + 2 s, ... (mod vocab)``: learnable next tokens."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=gen)
        stride = torch.randint(1, 4, (n, 1), generator=gen)
        self.tokens = (start + stride * torch.arange(seq)) % vocab

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def per_rank(value: float) -> list[float]:
    """``value`` of every rank under torchrun (rank order), else ``[value]``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    values: list = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def unit_count(model: torch.nn.Module) -> int:
    """FSDP units: fsdp_xla's on GSPMD, torch's FSDPModules on DTensor."""
    if hasattr(model, "fsdp_units"):
        return len(model.fsdp_units)
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(m, FSDPModule) for m in model.modules())


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def build_trainer(args: argparse.Namespace) -> FSDPTrainer:
    """The model (on the meta device unless ``--eager-init``) and the trainer, which shards it."""
    config = GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.seq,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    if args.eager_init:
        model = AutoModelForCausalLM.from_config(config)
    else:
        model = fsdp_xla.deferred_init(AutoModelForCausalLM.from_config, config)  # no parameter memory yet

    training_args = TrainingArguments(
        output_dir=str(args.output_dir),
        fsdp=True,  # --fsdp full_shard on the command line
        fsdp_config=args.fsdp_config,
        per_device_train_batch_size=args.batch,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to=[],
        dataloader_drop_last=True,
        optim="adamw_torch",
        use_cpu=TORCHRUN and not torch.accelerator.is_available(),  # accelerate: one gloo process per rank
    )
    return FSDPTrainer(
        model=model,
        args=training_args,
        train_dataset=CountingDataset(args.batch * args.steps, args.seq, args.vocab),
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    trainer = build_trainer(args)
    model = trainer.model
    n_params = sum(p.numel() for p in model.parameters())
    built_rss = per_rank(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # building + sharding
    result = trainer.train(resume_from_checkpoint=args.resume_from)
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    peak_rss = per_rank(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    model_bytes = n_params * 4  # float32
    out = {
        "losses": losses,
        "built_rss_bytes": built_rss,
        "peak_rss_bytes": peak_rss,
        "model_bytes": model_bytes,
        "units": unit_count(model),
        "backend": trainer.backend,
    }
    if is_main_process():
        gib = [f"{b / 2**30:.2f}" for b in built_rss]
        print(f"losses: {[round(x, 3) for x in losses]}")
        print(
            f"{n_params:,} parameters in {unit_count(model)} units; {model_bytes / 2**30:.3f} GiB unsharded "
            f"(float32), on {trainer.backend}; peak host RSS per process building the trainer {gib} GiB, whole run "
            f"{[f'{b / 2**30:.2f}' for b in peak_rss]} GiB; train loss {result.training_loss:.3f}"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(out))
    return out


if __name__ == "__main__":
    if GSPMD:
        from spmd.xla_log import show_repeated_notices_once

        show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    main()
