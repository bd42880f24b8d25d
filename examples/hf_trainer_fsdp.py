"""Train a GPT-2 built from a config through the Hugging Face Trainer with fsdp_xla, using the
PyTorch/XLA blog's ``fsdp_config.json`` unchanged, on 8 virtual devices by default.

    python examples/hf_trainer_fsdp.py                     # small GPT-2, deferred init
    python examples/hf_trainer_fsdp.py --eager-init --steps 20
    python examples/hf_trainer_fsdp.py --fsdp-config examples/fsdp_config.json --n-layer 6

The same flags as the blog's run_clm.py (``--fsdp full_shard --fsdp_config fsdp_config.json``)
reach the Trainer through TrainingArguments; the only change to a plain Trainer script is
``FSDPTrainer`` in place of ``Trainer`` and, for models larger than host memory,
``fsdp_xla.deferred_init(AutoModelForCausalLM.from_config, config)``. No download: the data
are synthetic token sequences made here (counting up by a random stride, so the loss falls).
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

from spmd import configure_default_devices

configure_default_devices()

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, TrainingArguments  # noqa: E402

import fsdp_xla  # noqa: E402
import spmd  # noqa: E402
from fsdp_xla.hf import FSDPTrainer  # noqa: E402

spmd.enable_spmd()  # before TrainingArguments: it picks the XLA device

HERE = Path(__file__).resolve().parent


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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsdp-config", default=str(HERE / "fsdp_config.json"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16, help="global batch (per_device_train_batch_size under SPMD)")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eager-init", action="store_true", help="build the model on the host first")
    parser.add_argument("--output-dir", default="runs/hf_trainer_fsdp")
    args = parser.parse_args(argv)

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
        output_dir=args.output_dir,
        fsdp=True,  # --fsdp full_shard on the command line
        fsdp_config=args.fsdp_config,
        per_device_train_batch_size=args.batch,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_drop_last=True,
        optim="adamw_torch",
    )
    trainer = FSDPTrainer(
        model=model,
        args=training_args,
        train_dataset=CountingDataset(args.batch * args.steps, args.seq, args.vocab),
    )
    built_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak so far: building + sharding
    result = trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    n_params = sum(p.numel() for p in model.parameters())
    print(f"losses: {[round(x, 3) for x in losses]}")
    print(
        f"{n_params:,} parameters in {len(model.fsdp_units)} units; peak host RSS building the trainer "
        f"{built_rss / 2**30:.2f} GiB, whole run {peak_rss / 2**30:.2f} GiB; train loss {result.training_loss:.3f}"
    )
    return {"losses": losses, "built_rss_bytes": built_rss, "peak_rss_bytes": peak_rss, "units": model.fsdp_units}


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    main()
