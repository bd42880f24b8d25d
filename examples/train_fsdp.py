"""Train a GPT-2-style model with nested FSDP (ZeRO-3) and AdamW on 8 devices.

Runs as is on 8 virtual CPU devices (no flags) and unchanged on a TPU VM; with
``--backend dtensor`` the same script runs on torch.distributed (one process per device:
TorchTPU, GPUs, or CPU processes with gloo):

    python examples/train_fsdp.py
    python examples/train_fsdp.py --layers 8 --d-model 512 --bf16 --checkpointing --deferred-init
    torchrun --nproc_per_node 4 examples/train_fsdp.py --backend dtensor

Every block is an FSDP unit: its weights are stored sharded over the ``fsdp`` mesh axis,
gathered for its forward, dropped, gathered again for its backward, and its gradients are
reduced back to shards. The token embedding and the LM head share one weight (GPT-2's tied
embeddings); both live in the root unit. Plain ``optimizer.step()`` updates the shards.
"""

from __future__ import annotations

import argparse
import math
import time

from spmd import configure_default_devices

configure_default_devices()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import spmd  # noqa: E402
from fsdp_xla import FSDP, MixedPrecision, deferred_init, transformer_auto_wrap_policy  # noqa: E402
from spmd import Mesh, P, mark_sharding  # noqa: E402


class Attention(torch.nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn = torch.nn.Linear(d_model, 3 * d_model)
        self.c_proj = torch.nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_head)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(torch.nn.Module):
    """A GPT-2 block (pre-LayerNorm attention and MLP, residual connections)."""

    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_head)
        self.ln_2 = torch.nn.LayerNorm(d_model)
        self.c_fc = torch.nn.Linear(d_model, 4 * d_model)
        self.c_proj = torch.nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    """GPT-2 with tied token embedding and LM head."""

    def __init__(self, vocab: int = 256, d_model: int = 128, n_head: int = 4, n_layer: int = 4, seq: int = 64):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d_model)
        self.wpe = torch.nn.Embedding(seq, d_model)
        self.h = torch.nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(d_model)
        self.lm_head = torch.nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: torch.nn.Module) -> None:
        """GPT-2's init (normal, std 0.02; zero biases); deferred init calls it per module too."""
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def synthetic_batch(generator: torch.Generator, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """Sequences counting up by a random stride mod vocab: learnable, so the loss must fall."""
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    stride = torch.randint(1, 4, (batch, 1), generator=generator)
    return (start + stride * torch.arange(seq + 1)) % vocab


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


def xla_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, mesh: Mesh
) -> torch.Tensor:
    """One training step on torch_xla: the global batch ``tokens`` goes to the devices split over
    the ``fsdp`` axis; returns the (computed) loss."""
    import torch_xla

    tokens = tokens.to(torch_xla.device())
    mark_sharding(tokens, mesh, P("fsdp", None))
    loss = lm_loss(model(tokens[:, :-1]), tokens)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    return loss


def rank_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> float:
    """One training step of this process on the DTensor backend: it trains on its part of the
    global batch ``tokens`` (FSDP averages the gradients); returns the global batch's mean loss."""
    import torch.distributed as dist

    world = dist.get_world_size()
    local = tokens.chunk(world)[dist.get_rank()]
    loss = lm_loss(model(local[:, :-1]), local)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / world


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16, help="global batch")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--bf16", action="store_true", help="compute in bfloat16 (fp32 sharded master weights)")
    parser.add_argument("--checkpointing", action="store_true", help="recompute each block in backward")
    parser.add_argument("--deferred-init", action="store_true", help="build on the meta device, init each shard")
    parser.add_argument("--backend", choices=["torch_xla", "dtensor"], default="torch_xla")
    args = parser.parse_args(argv)

    rank = 0
    if args.backend == "dtensor":  # under torchrun: one process per device
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        spmd.use_backend("dtensor")
        n, rank = dist.get_world_size(), dist.get_rank()
        where = f"{n} processes ({dist.get_backend()})"
    else:  # torch_xla is imported only here: the dtensor path runs where it is not installed
        import torch_xla.runtime as xr

        spmd.enable_spmd()
        n = xr.global_runtime_device_count()
        where = f"{n} ({xr.device_type()})"
    mesh = Mesh(np.arange(n), (n,), ("fsdp",))
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"devices: {where}, mesh: {dict(mesh.shape())}")

    torch.manual_seed(0)
    config = dict(vocab=args.vocab, d_model=args.d_model, n_head=args.heads, n_layer=args.layers, seq=args.seq)
    model = deferred_init(GPT, **config) if args.deferred_init else GPT(**config)
    model = FSDP(
        model,
        mesh=mesh,
        auto_wrap_policy=transformer_auto_wrap_policy({Block}),
        mixed_precision=MixedPrecision(torch.bfloat16) if args.bf16 else None,
        gradient_checkpointing=args.checkpointing,
    )
    n_params = sum(p.numel() for p in model.parameters())
    units = len(model.fsdp_units) if args.backend == "torch_xla" else sum(1 for _ in model.h) + 1
    say(f"parameters: {n_params:,} in {units} units, sharded {n} ways")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(0)

    losses = []
    for step in range(args.steps):
        started = time.perf_counter()
        tokens = synthetic_batch(gen, args.batch, args.seq, args.vocab)
        if args.backend == "dtensor":
            losses.append(rank_step(model, optimizer, tokens))
        else:
            losses.append(xla_step(model, optimizer, tokens, mesh).item())
        if step % 5 == 0 or step == args.steps - 1:
            say(f"step {step:3d}  loss {losses[-1]:.4f}  {time.perf_counter() - started:.2f} s")
    return losses


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    main()
