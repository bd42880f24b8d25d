"""Train a small GPT-style model with 2-D (data x model) sharding on 8 devices.

On torch_xla it runs as is on 8 virtual CPU devices and unchanged on a TPU VM; on current
PyTorch (no torch_xla) and under torchrun it runs on torch.distributed DTensor (one process
per device: TorchTPU, GPUs, or CPU processes with gloo; 4 processes make a (2, 2) mesh):

    torchrun --nproc_per_node 4 examples/train_spmd.py   # DTensor (the default under torchrun)
    python examples/train_spmd.py                        # torch_xla; without it, launches 4 DTensor ranks
    python examples/train_spmd.py --backend dtensor      # DTensor: launches its 4 ranks itself

Sharding (Megatron-style tensor parallelism on 'model', batch on 'data'):
  - token batch                 P('data', None)
  - attention qkv / MLP fc_in   P('model', None)   (output features split: column parallel)
  - attention out / MLP fc_out  P(None, 'model')   (input features split: row parallel)
  - embeddings                  P(None, 'model')
  - attention output            P('data') before the out projection (attention itself is not
                                split on 'model'; on DTensor this also keeps the gradient there
                                batch-sharded only, a layout DTensor's batched matmul can follow)

`spmd.shard_parameters` lays the parameters out on either backend. Tensors made inside the
forward (positions, the causal mask) are made ``*_like`` an input, so on DTensor they are
DTensors laid out like it (DTensor refuses to mix a plain tensor with a DTensor).
"""

from __future__ import annotations

import argparse
import math

from spmd import configure_default_devices

configure_default_devices()

try:
    from examples import _lane  # the repository is on the path (tests, PYTHONPATH)
except ImportError:
    import _lane  # run as a script: examples/ is on the path

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import spmd  # noqa: E402
from spmd import Mesh, P, mark_sharding, shard_parameters, with_sharding_constraint  # noqa: E402


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
        mask = torch.ones_like(att, dtype=torch.bool).tril()
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
        pos = torch.ones_like(idx).cumsum(1) - 1  # 0, 1, ... per row, laid out like idx
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def shard_model(model: TinyGPT, mesh: Mesh) -> None:
    """Megatron-style 2-D sharding: see the module docstring."""
    specs = {"wte.weight": P(None, "model"), "wpe.weight": P(None, "model"), "lm_head.weight": P("model", None)}
    for i, block in enumerate(model.blocks):
        for column_parallel in ("qkv", "fc_in"):
            specs[f"blocks.{i}.{column_parallel}.weight"] = P("model", None)
            specs[f"blocks.{i}.{column_parallel}.bias"] = P("model")
        for row_parallel in ("attn_out", "fc_out"):
            specs[f"blocks.{i}.{row_parallel}.weight"] = P(None, "model")
        block.attn_out.register_forward_pre_hook(lambda _, args: (with_sharding_constraint(args[0], mesh, P("data")),))
    shard_parameters(model, mesh, specs)


def synthetic_batch(generator: torch.Generator, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """Sequences counting up by a random stride mod vocab: learnable, so the loss must fall."""
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    stride = torch.randint(1, 4, (batch, 1), generator=generator)
    return (start + stride * torch.arange(seq + 1)) % vocab


def main(argv: list[str] | None = None) -> list[float]:
    parser = _lane.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=_lane.at_least(1), default=30)
    parser.add_argument("--batch", type=_lane.at_least(1), default=16, help="global batch")
    parser.add_argument("--model-axis", type=_lane.at_least(1), default=2, help="size of the 'model' mesh axis")
    parser.add_argument("--lr", type=_lane.positive_float, default=3e-3)
    parser.add_argument(
        "--backend", choices=["torch_xla", "dtensor"], help="default: dtensor under torchrun or without torch_xla"
    )
    args = parser.parse_args(argv)
    if (args.backend or _lane.default_backend()) == "dtensor" and not _lane.under_torchrun():
        launching = _lane.ranks_to_launch()  # checked here: one line, not one per rank and torchrun's traceback
        if launching % args.model_axis:
            parser.error(f"--model-axis {args.model_axis} does not divide the {launching} ranks this launches")
    args.backend = _lane.settle_backend(args.backend, __file__, argv)

    rank = 0
    if args.backend == "dtensor":  # under torchrun: one process per device
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        spmd.use_backend("dtensor")
        n, rank = dist.get_world_size(), dist.get_rank()
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        where = f"{n} processes ({dist.get_backend()})"
    else:  # torch_xla is imported only here: the dtensor path runs where it is not installed
        import torch_xla
        import torch_xla.runtime as xr

        spmd.enable_spmd()
        n, device = xr.global_runtime_device_count(), torch_xla.device()
        where = f"{n} ({xr.device_type()})"
    if n % args.model_axis:
        parser.error(f"--model-axis {args.model_axis} does not divide the {n} devices")
    mesh = Mesh(np.arange(n), (n // args.model_axis, args.model_axis), ("data", "model"))
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"devices: {where}, mesh: {dict(mesh.shape())}")

    torch.manual_seed(0)
    model = TinyGPT().to(device)
    shard_model(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(0)

    losses = []
    for step in range(args.steps):
        # Every process holds the same global batch; mark_sharding keeps its part (DTensor) or
        # lays it out over the devices (torch_xla). Use its return value: on DTensor it is new.
        tokens = mark_sharding(synthetic_batch(gen, args.batch, 32, 64).to(device), mesh, P("data", None))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.backend == "dtensor":
            losses.append(loss.full_tensor().item())  # each process holds a partial mean
        else:
            torch_xla.sync()
            losses.append(loss.item())
        if step % 5 == 0 or step == args.steps - 1:
            say(f"step {step:3d}  loss {losses[-1]:.4f}")
    return losses


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    main()
