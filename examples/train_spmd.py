"""Train a small GPT-style model with 2-D (data x model) sharding on 8 devices.

Runs as is on 8 virtual CPU devices (no flags) and unchanged on a TPU VM:

    python examples/train_spmd.py

Sharding (Megatron-style tensor parallelism on 'model', batch on 'data'):
  - token batch                 P('data', None)
  - attention qkv / MLP fc_in   P('model', None)   (output features split: column parallel)
  - attention out / MLP fc_out  P(None, 'model')   (input features split: row parallel)
  - embeddings                  P(None, 'model')
"""

from __future__ import annotations

import argparse
import math

from spmd import configure_default_devices

configure_default_devices()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

import spmd  # noqa: E402
from spmd import Mesh, P, mark_sharding  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.attn_out = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.fc_in = torch.nn.Linear(d_model, 4 * d_model)
        self.fc_out = torch.nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_head)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.attn_out(y)
        return x + self.fc_out(F.gelu(self.fc_in(self.ln2(x))))


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab: int = 64, d_model: int = 64, n_head: int = 4, n_layer: int = 2, seq: int = 32):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d_model)
        self.wpe = torch.nn.Embedding(seq, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(d_model)
        self.lm_head = torch.nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def shard_model(model: TinyGPT, mesh: Mesh) -> None:
    """Megatron-style 2-D sharding: see the module docstring."""
    mark_sharding(model.wte.weight, mesh, P(None, "model"))
    mark_sharding(model.wpe.weight, mesh, P(None, "model"))
    mark_sharding(model.lm_head.weight, mesh, P("model", None))
    for block in model.blocks:
        for column_parallel in (block.qkv, block.fc_in):
            mark_sharding(column_parallel.weight, mesh, P("model", None))
            mark_sharding(column_parallel.bias, mesh, P("model"))
        for row_parallel in (block.attn_out, block.fc_out):
            mark_sharding(row_parallel.weight, mesh, P(None, "model"))


def synthetic_batch(generator: torch.Generator, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """Sequences counting up by a random stride mod vocab: learnable, so the loss must fall."""
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    stride = torch.randint(1, 4, (batch, 1), generator=generator)
    return (start + stride * torch.arange(seq + 1)) % vocab


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16, help="global batch")
    parser.add_argument("--model-axis", type=int, default=2, help="size of the 'model' mesh axis")
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args(argv)

    spmd.enable_spmd()
    n = xr.global_runtime_device_count()
    mesh = Mesh(np.arange(n), (n // args.model_axis, args.model_axis), ("data", "model"))
    print(f"devices: {n} ({xr.device_type()}), mesh: {mesh.shape()}")

    torch.manual_seed(0)
    device = torch_xla.device()
    model = TinyGPT().to(device)
    shard_model(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(0)

    losses = []
    for step in range(args.steps):
        tokens = synthetic_batch(gen, args.batch, 32, 64).to(device)
        mark_sharding(tokens, mesh, P("data", None))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        losses.append(loss.item())
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.4f}")
    return losses


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    main()
