"""Train a GPT-2-style model with nested FSDP (ZeRO-3) and AdamW on 8 devices.

On torch_xla it runs as is on 8 virtual CPU devices and unchanged on a TPU VM; on current
PyTorch (no torch_xla) and under torchrun it runs on torch.distributed DTensor (one process
per device: TorchTPU, GPUs, or CPU processes with gloo):

    torchrun --nproc_per_node 4 examples/train_fsdp.py   # DTensor (the default under torchrun)
    python examples/train_fsdp.py                        # torch_xla; without it, launches 4 DTensor ranks
    python examples/train_fsdp.py --layers 8 --d-model 512 --bf16 --checkpointing --deferred-init
    torchrun --nproc_per_node 4 --max-restarts 3 examples/train_fsdp.py \
        --checkpoint-dir ckpt --save-every 5 --timeout 60

Every block is an FSDP unit: its weights are stored sharded over the ``fsdp`` mesh axis,
gathered for its forward, dropped, gathered again for its backward, and its gradients are
reduced back to shards. The token embedding and the LM head share one weight (GPT-2's tied
embeddings); both live in the root unit. Plain ``optimizer.step()`` updates the shards.

Each process loads only its rows of every global batch (`spmd.ProcessDataLoader`: torch_xla's
one process here loads them all; each of 4 DTensor ranks a quarter). With ``--checkpoint-dir``
the run saves model, optimizer, step, data position and RNG every ``--save-every`` steps and,
on start, resumes from the newest complete checkpoint (a directory holding versions but no
``LATEST`` is refused, exit 2: it is never trained over), so a run killed at any moment and
started again (``torchrun --max-restarts``) ends with the losses of one that never stopped.
``--timeout`` ends a collective that waits on a stopped rank (`spmd.init_process_group`).
"""

from __future__ import annotations

import argparse
import base64
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
from fsdp_xla import FSDP, MixedPrecision, deferred_init, transformer_auto_wrap_policy  # noqa: E402
from fsdp_xla.checkpoint import checkpoint_version, has_checkpoint, load_sharded, save_sharded  # noqa: E402
from fsdp_xla.errors import CheckpointError  # noqa: E402
from spmd import Mesh, P, ProcessDataLoader, mark_sharding, watch_collectives  # noqa: E402


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


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> torch.Tensor:
    """Forward, backward and AdamW on ``tokens`` (torch_xla: the global batch, sharded; DTensor:
    this rank's rows); returns the loss (of those rows)."""
    loss = lm_loss(model(tokens[:, :-1]), tokens)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def xla_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, mesh: Mesh
) -> torch.Tensor:
    """One training step on torch_xla: the global batch ``tokens`` (on the host) goes to the
    devices split over the ``fsdp`` axis; returns the (computed) loss."""
    import torch_xla

    tokens = tokens.to(torch_xla.device())
    mark_sharding(tokens, mesh, P("fsdp", None))
    loss = train_step(model, optimizer, tokens)
    torch_xla.sync()
    return loss


def local_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, local: torch.Tensor) -> float:
    """One training step of this process on the DTensor backend on its rows ``local`` (FSDP
    averages the gradients); returns the global batch's mean loss."""
    import torch.distributed as dist

    loss = train_step(model, optimizer, local)
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def rank_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> float:
    """`local_step` on this rank's part of the global batch ``tokens`` (every rank holds it all)."""
    import torch.distributed as dist

    return local_step(model, optimizer, tokens.chunk(dist.get_world_size())[dist.get_rank()])


class SyntheticTokens(torch.utils.data.Dataset):
    """``rows`` sequences counting up by a random stride mod ``vocab``; row ``i`` depends only on
    ``(seed, i)``, so any process can load any row."""

    def __init__(self, rows: int, seq: int, vocab: int, seed: int = 0) -> None:
        self.rows, self.seq, self.vocab, self.seed = rows, seq, vocab, seed

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> torch.Tensor:
        return synthetic_batch(torch.Generator().manual_seed(self.seed * 2**32 + i), 1, self.seq, self.vocab)[0]


def forever(loader: ProcessDataLoader) -> Iterator[torch.Tensor]:
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def _rng_state() -> str:
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()


def _set_rng_state(text: str) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8))


def save(directory: Path, model: torch.nn.Module, optimizer: Any, loader: ProcessDataLoader, step: int) -> None:
    """A checkpoint after ``step`` steps: weights, optimizer, the data position and every
    process's RNG state (``save_sharded`` writes it atomically; a save cut off never counts)."""
    rng = [_rng_state()]
    if spmd.backend_for(None).name == "dtensor":
        import torch.distributed as dist

        rng = [None] * dist.get_world_size()
        dist.all_gather_object(rng, _rng_state())
    extra = {"step": step, "data": loader.state_dict(), "rng": rng}
    save_sharded(directory, model, optimizer, extra=extra, keep=2)


def resume(directory: Path, model: torch.nn.Module, optimizer: Any, loader: ProcessDataLoader) -> int:
    """Load the newest complete checkpoint in ``directory``, if any; the step to continue from.
    A directory holding versions but no ``LATEST`` is a `CheckpointError` (`has_checkpoint`):
    never trained over."""
    if not has_checkpoint(directory):
        return 0
    extra = load_sharded(directory, model, optimizer)
    loader.load_state_dict(extra["data"])
    rng = extra["rng"]
    backend = spmd.backend_for(None)
    if len(rng) == backend.process_count():  # the same processes: each takes its own stream back
        _set_rng_state(rng[backend.process_index()])
    return int(extra["step"])


def check_checkpoint_dir(directory: Path) -> None:
    """Exit 2 with one line if ``directory`` is no place to resume from or to start in: it holds
    versions but no ``LATEST`` (another run's, or a damaged checkpoint; `has_checkpoint`), or its
    ``LATEST`` names no complete version (`checkpoint_version`; each rank raised it at resume)."""
    try:
        if has_checkpoint(directory):
            checkpoint_version(directory)
    except CheckpointError as e:
        print(f"train_fsdp.py: error: --checkpoint-dir: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _lane.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=_lane.at_least(1), default=20)
    parser.add_argument(
        "--batch",
        type=_lane.at_least(1),
        default=None,
        help="global batch (default: 16, or one row per device on more)",
    )
    parser.add_argument("--seq", type=_lane.at_least(1), default=64)
    parser.add_argument("--vocab", type=_lane.at_least(2), default=256)
    parser.add_argument("--layers", type=_lane.at_least(1), default=4)
    parser.add_argument("--d-model", type=_lane.at_least(1), default=128)
    parser.add_argument("--heads", type=_lane.at_least(1), default=4)
    parser.add_argument("--lr", type=_lane.positive_float, default=3e-3)
    parser.add_argument("--bf16", action="store_true", help="compute in bfloat16 (fp32 sharded master weights)")
    parser.add_argument("--checkpointing", action="store_true", help="recompute each block in backward")
    parser.add_argument("--deferred-init", action="store_true", help="build on the meta device, init each shard")
    parser.add_argument(
        "--backend", choices=["torch_xla", "dtensor"], help="default: dtensor under torchrun or without torch_xla"
    )
    parser.add_argument("--dataset-rows", type=_lane.at_least(1), default=4096, help="rows of the synthetic dataset")
    parser.add_argument(
        "--checkpoint-dir", type=_lane.output_dir, help="save here, and resume from the newest checkpoint"
    )
    parser.add_argument("--save-every", type=_lane.at_least(0), default=0, help="save every N steps (0: never)")
    parser.add_argument(
        "--timeout", type=_lane.positive_float, default=600.0, help="seconds a collective may wait (dtensor)"
    )
    args = parser.parse_args(argv)
    if args.d_model % args.heads:
        parser.error(f"--heads {args.heads} must divide --d-model {args.d_model}")
    if args.save_every and args.checkpoint_dir is None:
        parser.error("--save-every needs --checkpoint-dir")
    if args.checkpoint_dir is not None:
        check_checkpoint_dir(args.checkpoint_dir)  # before any rank starts: one line, not one per rank
    launching = (args.backend or _lane.default_backend()) == "dtensor" and not _lane.under_torchrun()
    if launching and args.batch is not None and args.batch % _lane.ranks_to_launch():
        parser.error(f"--batch {args.batch} does not split over the {_lane.ranks_to_launch()} ranks this launches")
    args.backend = _lane.settle_backend(args.backend, __file__, argv)
    return args


def start_runtime(args: argparse.Namespace) -> tuple[int, int, str]:
    """(devices, this process's rank, where) for the chosen backend."""
    if args.backend == "dtensor":  # under torchrun: one process per device
        import torch.distributed as dist

        if not dist.is_initialized():
            spmd.init_process_group(timeout=args.timeout)
        spmd.use_backend("dtensor")
        return dist.get_world_size(), dist.get_rank(), f"{dist.get_world_size()} processes ({dist.get_backend()})"
    import torch_xla.runtime as xr  # only here: the dtensor path runs where torch_xla is not installed

    spmd.enable_spmd()
    n = xr.global_runtime_device_count()
    return n, 0, f"{n} ({xr.device_type()})"


def build(args: argparse.Namespace, mesh: Mesh) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
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
    return model, torch.optim.AdamW(model.parameters(), lr=args.lr)


Hook = Callable[[str, int, dict], None]


def main(argv: list[str] | None = None, hook: Hook | None = None) -> list[float]:
    """Train; the losses of the steps this run made (from the resumed step on). ``hook(event,
    step, info)`` is called at ``"step"`` (before it; ``info["position"]``: the data position),
    ``"loss"`` (after; ``info["loss"]``), ``"save"`` and ``"saved"``: tests kill ranks there."""
    args = parse_args(argv)
    hook = hook or (lambda event, step, info: None)
    n, rank, where = start_runtime(args)
    if args.batch is not None and args.batch % n:  # under an explicit torchrun the world is known only now
        _lane.world_flag_error(__file__, f"--batch {args.batch} does not split over the {n} ranks of this run")
    mesh = Mesh(np.arange(n), (n,), ("fsdp",))
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"devices: {where}, mesh: {dict(mesh.shape())}")
    model, optimizer = build(args, mesh)
    n_params = sum(p.numel() for p in model.parameters())
    units = len(model.fsdp_units) if args.backend == "torch_xla" else sum(1 for _ in model.h) + 1
    say(f"parameters: {n_params:,} in {units} units, sharded {n} ways")
    dataset = SyntheticTokens(args.dataset_rows, args.seq, args.vocab)
    # The batch splits over every device: 16 rows, rounded up to a multiple of the device count.
    batch = args.batch if args.batch is not None else n * -(-16 // n)
    loader = ProcessDataLoader(dataset, batch, mesh, P("fsdp", None), seed=0)
    first = resume(args.checkpoint_dir, model, optimizer, loader) if args.checkpoint_dir else 0
    if first:
        say(f"resumed from {args.checkpoint_dir} at step {first}")
    batches, losses = forever(loader), []
    for step in range(first, args.steps):
        started = time.perf_counter()
        hook("step", step, {"position": loader.state_dict()})
        with watch_collectives(f"step {step}"):
            tokens = next(batches)
            if args.backend == "dtensor":
                losses.append(local_step(model, optimizer, tokens.to_local()))
            else:
                import torch_xla

                loss = train_step(model, optimizer, tokens)
                torch_xla.sync()
                losses.append(loss.item())
        hook("loss", step, {"loss": losses[-1]})
        if step % 5 == 0 or step == args.steps - 1:
            say(f"step {step:3d}  loss {losses[-1]:.4f}  {time.perf_counter() - started:.2f} s")
        if args.save_every and (step + 1) % args.save_every == 0:
            hook("save", step, {})
            with watch_collectives(f"save after step {step}"):
                save(args.checkpoint_dir, model, optimizer, loader, step + 1)
            hook("saved", step, {})
    return losses


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    main()
