"""Train a Llama-style model on long sequences with context parallelism (CP) and FSDP.

The sequence of every batch is split over a ``context`` mesh axis: each device holds
``seq / context`` of its tokens (a head and a tail chunk, so causal attention costs each the same),
computes every token-wise layer on them alone, and gathers the keys and values of the others once
per attention (`spmd.context_parallel`). FSDP stores the parameters sharded over ``fsdp`` x
``context`` (as torchtitan does), so adding context devices also divides the weights. The model has
grouped-query attention (fewer key/value heads), rotary position embeddings, RMSNorm and SwiGLU.

    torchrun --nproc_per_node 4 examples/train_long_context.py                 # DTensor: fsdp 2 x context 2
    torchrun --nproc_per_node 4 examples/train_long_context.py --context 4 --seq 4096
    torchrun --nproc_per_node 4 examples/train_long_context.py --tensor 2      # context 2 x tensor 2
    python examples/train_long_context.py                                      # torch_xla: 8 devices, fsdp 4 x context 2
    python examples/train_long_context.py --tensor 2                           # fsdp 2 x context 2 x tensor 2
    python examples/train_long_context.py --context 1                          # the same model without CP

``--tensor N`` adds Megatron tensor parallelism on a third axis: each block's attention heads and
MLP columns split over ``tensor`` (`tensor_parallel`), before FSDP shards what each holds over
fsdp x context. ``--checkpoint-dir`` with ``--save-every`` saves model and optimizer (each
process its shards); started again with the same ``--checkpoint-dir``, at any ``--context`` or
``--tensor``, the run resumes from the newest checkpoint with the losses of one never stopped.

The same script runs on both backends: on torch_xla (one process, GSPMD) the batch is the global
batch laid out over the mesh; under torchrun (DTensor) each rank computes its own block of it.
The losses printed are the global batch's mean on both, and equal to the run without CP.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from spmd import configure_default_devices

configure_default_devices()  # 8 virtual CPU devices for torch_xla unless a TPU is here (before torch_xla)

try:
    from examples import _lane  # the repository is on the path (tests, PYTHONPATH)
except ImportError:
    import _lane  # run as a script: examples/ is on the path

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import spmd  # noqa: E402
from fsdp_xla import FSDP, CheckpointError, MixedPrecision, deferred_init, transformer_auto_wrap_policy  # noqa: E402
from fsdp_xla.checkpoint import checkpoint_version, has_checkpoint, load_sharded, save_sharded  # noqa: E402
from fsdp_xla.hf import DEFAULT_AXIS_RULES  # noqa: E402
from mesh import Mesh, MeshError, ParallelDims  # noqa: E402
from spmd.context import SequenceOrder  # noqa: E402
from spmd.errors import SequenceLengthError  # noqa: E402
from spmd.logical_axes import ShardingPlan  # noqa: E402


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[batch, heads, seq, head_dim]`` at token ``positions`` ``[batch, seq]``:
    the positions, not the index along the sequence, because a context shard's tokens are not contiguous."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions[:, None, :, None].float() * freqs  # [batch, 1, seq, half]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(torch.nn.Module):
    def __init__(self, d_model: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d_model // heads
        self.q_proj = torch.nn.Linear(d_model, heads * self.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(d_model, kv_heads * self.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(d_model, kv_heads * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(heads * self.head_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = rotate(q, positions), rotate(k, positions)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class Block(torch.nn.Module):
    """A Llama decoder layer: pre-norm attention and SwiGLU MLP, residual connections."""

    def __init__(self, d_model: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(d_model), RMSNorm(d_model)
        self.attn = Attention(d_model, heads, kv_heads)
        self.gate = torch.nn.Linear(d_model, hidden, bias=False)
        self.up = torch.nn.Linear(d_model, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, vocab: int = 256, d_model: int = 128, layers: int = 2, heads: int = 4, kv_heads: int = 2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.layers = torch.nn.ModuleList(Block(d_model, heads, kv_heads, 2 * d_model) for _ in range(layers))
        self.norm = RMSNorm(d_model)
        self.lm_head = torch.nn.Linear(d_model, vocab, bias=False)
        self.apply(self._init_weights)

    def _init_weights(self, module: torch.nn.Module) -> None:
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, position_ids)
        return self.lm_head(self.norm(x))


def synthetic_tokens(step: int, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """``[batch, seq + 1]`` sequences counting up by a random stride mod ``vocab`` (learnable), the
    same on every process for a step: each takes its block (`ContextParallel.shard_batch`)."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    return (start + stride * torch.arange(seq + 1)) % vocab


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _lane.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=_lane.at_least(1), default=10)
    parser.add_argument("--seq", type=_lane.at_least(1), default=512, help="tokens per sequence")
    parser.add_argument(
        "--batch", type=_lane.at_least(1), default=None, help="global batch (default: one sequence per fsdp shard)"
    )
    parser.add_argument("--context", type=_lane.at_least(1), default=2, help="context parallel degree (1: no CP)")
    parser.add_argument(
        "--tensor", type=_lane.at_least(1), default=1, help="tensor parallel degree (Megatron attention and MLP)"
    )
    parser.add_argument("--no-load-balance", action="store_true", help="contiguous chunks instead of head-tail pairs")
    parser.add_argument("--vocab", type=_lane.at_least(2), default=256)
    parser.add_argument("--d-model", type=_lane.at_least(1), default=128)
    parser.add_argument("--layers", type=_lane.at_least(1), default=2)
    parser.add_argument("--heads", type=_lane.at_least(1), default=4)
    parser.add_argument("--kv-heads", type=_lane.at_least(1), default=2)
    parser.add_argument("--lr", type=_lane.positive_float, default=3e-3)
    parser.add_argument("--bf16", action="store_true", help="compute in bfloat16 (fp32 sharded master weights)")
    parser.add_argument("--checkpointing", action="store_true", help="recompute each block in backward")
    parser.add_argument("--deferred-init", action="store_true", help="build on the meta device, init each shard")
    parser.add_argument("--backend", choices=("dtensor", "torch_xla"), default=None)
    parser.add_argument(
        "--checkpoint-dir",
        type=_lane.output_dir,
        help="save here, and resume from its newest checkpoint (at any --context)",
    )
    parser.add_argument("--save-every", type=_lane.at_least(0), default=0, help="save every N steps (0: never)")
    args = parser.parse_args(argv)
    if args.save_every and args.checkpoint_dir is None:
        parser.error("--save-every needs --checkpoint-dir")
    if args.checkpoint_dir is not None:  # before any rank starts: one line, not one per rank at resume
        try:
            if has_checkpoint(args.checkpoint_dir):
                checkpoint_version(args.checkpoint_dir)
        except CheckpointError as e:
            parser.error(f"--checkpoint-dir: {e}")
    if args.heads % args.kv_heads or args.d_model % args.heads:
        parser.error("--heads must divide --d-model, and --kv-heads must divide --heads")
    if args.kv_heads % args.tensor:  # then --heads divides too: each kv head's query heads go with it
        parser.error(
            f"--tensor {args.tensor} must divide --kv-heads {args.kv_heads}: each tensor shard computes whole "
            "key/value heads and their query heads"
        )
    try:  # the sequence's chunks over the context shards, and, where this launches the ranks, the world
        SequenceOrder(args.seq, args.context, load_balance=not args.no_load_balance)
        if (args.backend or _lane.default_backend()) == "dtensor" and not _lane.under_torchrun():
            dims = ParallelDims.for_world(_lane.ranks_to_launch(), context=args.context, tensor=args.tensor)
            rows = dims.fsdp * max(1, dims.data)  # the batch's rows split over the data and fsdp axes
            if args.batch is not None and args.batch % rows:
                parser.error(f"--batch {args.batch} does not split over the {rows} data x fsdp shards this launches")
    except (SequenceLengthError, MeshError) as e:
        parser.error(str(e))
    args.backend = _lane.settle_backend(args.backend, __file__, argv)
    return args


def start_runtime(backend: str) -> tuple[int, int]:
    """(devices, this process's rank) of the chosen backend."""
    if backend == "dtensor":
        import torch.distributed as dist

        if not dist.is_initialized():
            spmd.init_process_group()
        spmd.use_backend("dtensor")
        return dist.get_world_size(), dist.get_rank()
    import torch_xla.runtime as xr

    spmd.enable_spmd()
    return xr.global_runtime_device_count(), 0


# Megatron's split of a block (torchtitan's llama plan without its sequence parallelism): the
# projections into heads and into the MLP split their outputs (column parallel), the projections
# back split their inputs (row parallel), so each tensor shard computes its own heads and its own
# part of the MLP, and one all-reduce per attention and per MLP joins them.
COLUMN, ROW = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "gate", "up"), ("attn.o_proj", "down")

# The same split as stored layouts for GSPMD: logical axes per weight ([out, in] for nn.Linear),
# mapped by the rules to ``tensor`` (heads, mlp) and to FSDP's fsdp x context (embed).
TENSOR_PLAN = ShardingPlan(
    params=(
        (r"attn\.(q|k|v)_proj\.weight$", ("heads", "embed")),
        (r"attn\.o_proj\.weight$", ("embed", "heads")),
        (r"\.(gate|up)\.weight$", ("mlp", "embed")),
        (r"\.down\.weight$", ("embed", "mlp")),
        (r"^(embed|lm_head)\.weight$", (None, "embed")),  # the vocab stays whole, as on DTensor
        (r"norm\.weight$", ("norm",)),
    ),
    axes=DEFAULT_AXIS_RULES,
    name="train_long_context",
)


def tensor_parallel(model: torch.nn.Module, mesh: Mesh) -> Any:
    """Split each block over the mesh's ``tensor`` axis, before FSDP (torchtitan's order: FSDP then
    shards the tensor-parallel weights over its own axes, FSDP2's 2-D layout). On DTensor torch's
    ``parallelize_module`` makes the weights DTensors over the tensor axis and returns ``None``; on
    torch_xla it returns FSDP's ``param_spec_fn``: the stored layouts name ``tensor`` and FSDP's
    axes, and GSPMD splits the computation to match."""
    if spmd.backend_for(None).name == "torch_xla":
        return TENSOR_PLAN.param_spec_fn(mesh)
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {**{name: ColwiseParallel() for name in COLUMN}, **{name: RowwiseParallel() for name in ROW}}
    tensor_mesh = spmd.device_mesh(mesh)["tensor"]
    for block in model.layers:
        parallelize_module(block, tensor_mesh, plan)
    return None


def build(args: argparse.Namespace, dims: ParallelDims) -> tuple[torch.nn.Module, Any, torch.optim.Optimizer]:
    """The model (split over tensor, then sharded over fsdp x context), its context-parallel plan,
    and AdamW."""
    torch.manual_seed(0)
    config = dict(vocab=args.vocab, d_model=args.d_model, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads)
    model = deferred_init(Llama, **config) if args.deferred_init else Llama(**config)
    mesh = dims.mesh()  # one mesh object for all three: its DeviceMesh is built once
    param_spec_fn = tensor_parallel(model, mesh) if dims.tensor > 1 else None  # before FSDP
    model = FSDP(
        model,
        mesh=mesh,
        fsdp_axis=dims.param_shard_axes,
        auto_wrap_policy=transformer_auto_wrap_policy({Block}),
        mixed_precision=MixedPrecision(torch.bfloat16) if args.bf16 else None,
        gradient_checkpointing=args.checkpointing,
        param_spec_fn=param_spec_fn,
    )
    plan = spmd.context_parallel(model, mesh, load_balance=not args.no_load_balance) if dims.context > 1 else None
    return model, plan, torch.optim.AdamW(model.parameters(), lr=args.lr)


def split_batch(plan: Any, dims: ParallelDims, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs, labels and positions of the global batch ``tokens`` as this process holds them:
    split over the context axis by the plan; without CP, only the rows split (as in train_fsdp)."""
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
    if plan is not None:
        return plan.shard_batch(batch)
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
    spec = spmd.P(dims.batch_axes or None)
    if spmd.backend_for(None).name == "dtensor":
        rows = spmd.process_rows(dims.mesh(), spec, tokens.shape[0])
        return {k: v[rows] for k, v in batch.items()}
    return {
        k: spmd.mark_sharding(v.to(spmd.backend_for(None).compute_device()), dims.mesh(), spec)
        for k, v in batch.items()
    }


def train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> Any:
    """Forward, backward and AdamW on ``batch``; returns this process's mean loss over the
    tokens it holds (torch_xla: all of them)."""
    logits = model(batch["input_ids"], batch["position_ids"])
    # classes on dim 1, the tokens left [rows, seq]: flattening them would make GSPMD gather the
    # logits along the sequence (rows and tokens are split over different mesh axes)
    loss = F.cross_entropy(logits.float().transpose(1, 2), batch["labels"])
    optimizer.zero_grad()
    loss.backward()  # FSDP averages every process's gradients: each holds as many tokens
    optimizer.step()
    return loss


def global_loss(loss: torch.Tensor, backend: str) -> float:
    """The global batch's mean loss: the processes' means averaged (each holds as many tokens)."""
    if backend == "torch_xla":
        import torch_xla

        torch_xla.sync()
        return loss.item()
    import torch.distributed as dist

    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def save(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """A checkpoint after ``step`` steps: the weights and AdamW's state, each process writing its
    shards (`save_sharded`, atomic). The batches are a function of the step, so the step is all
    the data position there is."""
    save_sharded(directory, model, optimizer, extra={"step": step}, keep=2)


def resume(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the newest checkpoint in ``directory`` into the model and optimizer as they are
    sharded now (any context, fsdp or device count: each tensor is laid out as its parameter's
    current sharding); the step to continue from, 0 where there is none."""
    if not has_checkpoint(directory):
        return 0
    return int(load_sharded(directory, model, optimizer)["step"])


def main(argv: list[str] | None = None) -> list[float]:
    """Train; the global batch's loss of every step this run made (from the resumed step on)."""
    args = parse_args(argv)
    devices, rank = start_runtime(args.backend)
    try:
        dims = ParallelDims.for_world(devices, context=args.context, tensor=args.tensor)
    except MeshError as e:  # the world is known only now (under torchrun, or torch_xla's devices): one line
        _lane.world_flag_error(__file__, str(e))
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"{devices} devices, {args.backend}: {dims.mesh().describe()}, {args.seq} tokens a sequence")
    model, plan, optimizer = build(args, dims)
    first = resume(args.checkpoint_dir, model, optimizer) if args.checkpoint_dir else 0
    if first:
        say(f"resumed from {args.checkpoint_dir} at step {first}")
    batch = args.batch or dims.fsdp * max(1, dims.data)
    losses = []
    for step in range(first, args.steps):
        started = time.perf_counter()
        tokens = synthetic_tokens(step, batch, args.seq, args.vocab)
        loss = train_step(model, split_batch(plan, dims, tokens), optimizer)
        losses.append(global_loss(loss, args.backend))
        if step % 5 == 0 or step == args.steps - 1:
            tokens = batch * args.seq / (time.perf_counter() - started)
            say(f"step {step:3d}  loss {losses[-1]:.5f}  {tokens:,.0f} tokens/s")
        if args.save_every and (step + 1) % args.save_every == 0:
            save(args.checkpoint_dir, model, optimizer, step + 1)
    if losses and math.isnan(losses[-1]):
        raise SystemExit("the loss is NaN")
    return losses


if __name__ == "__main__":
    main()
