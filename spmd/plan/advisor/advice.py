"""The advisor's values: a `Candidate` plan, its `Outcome`, and the `Advice` (ranking, the
winner as code and as a Trainer ``fsdp_config.json``, and the published figure beside it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mesh import Role
from spmd.plan.predict.published import published_for
from spmd.plan.report.plan_report import GIB, PlanReport
from spmd.plan.request.custom_remat import CustomRemat
from spmd.plan.request.dcn import split_dcn, whole_sizes
from spmd.plan.request.meshes import batch_axes
from spmd.plan.request.remat import Remat
from spmd.sharding import P

__all__ = ["Advice", "Candidate", "Outcome", "advice_table", "winner_code"]


@dataclass(frozen=True)
class Candidate:
    """One plan to try: strategy, mesh axis sizes, sequences per batch shard, remat policy."""

    strategy: str
    mesh: tuple[tuple[str, int], ...]
    per_device_batch: int
    remat: str = Remat.DOTS.value

    @property
    def mesh_shape(self) -> dict[str, int]:
        """The mesh as `spmd.plan.plan` takes it (``dcn_`` sizes across slices kept: `spmd.plan.request.dcn`)."""
        return dict(self.mesh)

    @property
    def whole_mesh(self) -> dict[str, int]:
        """Each axis's whole size (``dcn_fsdp=2, fsdp=64`` is ``fsdp`` 128)."""
        return whole_sizes(self.mesh_shape)

    @property
    def global_batch(self) -> int:
        """Per-device batch times the batch shards (every axis but ``tensor``)."""
        shape = self.whole_mesh
        return self.per_device_batch * math.prod(shape[a] for a in batch_axes(shape))

    def label(self) -> str:
        """One line: ``fsdp=16 × tensor=2 · batch 4 · remat full``."""
        mesh = " × ".join(f"{a}={s}" for a, s in self.mesh)
        return f"{mesh} · batch {self.per_device_batch} · remat {self.remat}"


@dataclass(frozen=True)
class Outcome:
    """A candidate and its compiled report, or why it was not compiled."""

    candidate: Candidate
    report: PlanReport | None = None
    skipped: str = ""
    cached: bool = False

    @property
    def fits(self) -> bool:
        return self.report is not None and self.report.fits


@dataclass(frozen=True)
class Advice:
    """The advisor's result: every candidate's outcome, fitting ones first, best first (``interrupted``:
    the search was stopped by Ctrl-C, and these are the plans done by then)."""

    model: str
    topology: str
    chip: str
    chips: int
    slices: int
    seq_len: int
    compute_dtype: str
    attention: str
    hbm_bytes: int
    outcomes: tuple[Outcome, ...]
    block_class: str | None = None
    model_type: str | None = None
    notes: tuple[str, ...] = field(default=())
    interrupted: bool = False  # Ctrl-C stopped the search: the outcomes are a part of it
    weight_dtype: str = "float32"  # the stored parameters and second moment (MaxText's weight_dtype)
    fused: tuple[str, ...] = ()  # projections planned as one matmul (MaxText's fused_qkv, fused_mlp)

    @property
    def winner(self) -> Outcome | None:
        return self.outcomes[0] if self.outcomes and self.outcomes[0].fits else None

    def largest_batches(self) -> list[Outcome]:
        """For each (strategy, mesh, remat) that fits at all: its largest fitting batch, best first."""
        best: dict[tuple[Any, ...], Outcome] = {}
        for o in self.outcomes:
            c = o.candidate
            key = (c.strategy, c.mesh, c.remat)
            if o.fits and (key not in best or c.per_device_batch > best[key].candidate.per_device_batch):
                best[key] = o
        return sorted(best.values(), key=lambda o: -o.report.mfu)  # type: ignore[union-attr]

    def published(self) -> str | None:
        """The published run of this model on this many chips, if any (`spmd.plan.predict.published`)."""
        found = published_for(self.model, self.chip, self.chips, self.seq_len, self.slices)
        return None if found is None else found.line()

    def table(self) -> str:
        return advice_table(self)

    def code(self) -> str:
        """The winner as a training-script fragment for `fsdp_xla` / `spmd`."""
        return winner_code(self)

    def fsdp_config(self) -> dict[str, Any] | None:
        """The winner as a Trainer ``fsdp_config`` (``None`` for data parallel, which is not FSDP,
        and for context parallelism, which the Trainer does not run)."""
        w = self.winner
        if w is None or w.candidate.strategy == "dp" or Role.CONTEXT.value in w.candidate.mesh_shape:
            return None
        config: dict[str, Any] = {"xla": True, "xla_fsdp_v2": True}
        if self.block_class:
            config["transformer_layer_cls_to_wrap"] = [self.block_class.rpartition(".")[2]]
        config["xla_fsdp_grad_ckpt"] = _checkpoints_layers(Remat.parse(w.candidate.remat))
        if self.compute_dtype == "bfloat16":
            config["xla_fsdp_settings"] = {"compute_dtype": "bfloat16"}
        return config

    def to_dict(self) -> dict[str, Any]:
        settings = ("compute_dtype", "weight_dtype", "attention", "hbm_bytes", "fused")
        head = {k: getattr(self, k) for k in ("model", "topology", "chip", "chips", "slices", "seq_len", *settings)}
        return {
            **head,
            "winner": None
            if self.winner is None
            else f"{self.winner.candidate.strategy} {self.winner.candidate.label()}",
            "published": self.published(),
            "code": self.code(),
            "fsdp_config": self.fsdp_config(),
            "outcomes": [_outcome_dict(o) for o in self.outcomes],
        }


def _outcome_dict(o: Outcome) -> dict[str, Any]:
    c = o.candidate
    return {
        "strategy": c.strategy,
        "mesh": c.mesh_shape,
        "per_device_batch": c.per_device_batch,
        "global_batch": c.global_batch,
        "remat": c.remat,
        "skipped": o.skipped,
        "cached": o.cached,
        "report": None if o.report is None else o.report.to_dict(),
    }


# -- the advice as text ------------------------------------------------------------------

_WIDTH = 50


def _row(rank: int, o: Outcome) -> str:
    label = f"{o.candidate.strategy:4s} {o.candidate.label()}"
    r = o.report
    if r is None:
        return f"  {rank:2d}  {label:{_WIDTH}s} {'':>9s} {'':>9s} {'':>11s} {'':>9s} {'':>15s}  {o.skipped}"
    if r.memory.compiler_oom_bytes is None:  # the compiler's OOM leaves no program to estimate
        e = r.estimate
        bound = f"{e.mfu_serial:.1%}..{e.mfu_overlapped:.1%}"
        estimate = f"{r.step_seconds * 1e3:9.1f} {r.tokens_per_second / r.devices:11.0f} {r.mfu:9.1%} {bound:>15s}"
    else:
        estimate = f"{'-':>9s} {'-':>11s} {'-':>9s} {'-':>15s}"
    cached = " (cached)" if o.cached else ""
    return f"  {rank:2d}  {label:{_WIDTH}s} {r.memory.total_bytes / GIB:9.2f} {estimate}  {r.memory.short_verdict()}{cached}"


def _largest(advice: Advice) -> list[str]:
    best = advice.largest_batches()
    if not best:
        return []
    lines = ["", "largest batch that fits, per plan and remat policy:"]
    for o in best:
        r = o.report
        lines.append(
            f"  {o.candidate.strategy:4s} {o.candidate.label():{_WIDTH}s} peak {r.memory.total_bytes / GIB:6.2f} GiB"  # type: ignore[union-attr]
            f"/device, predicted MFU {r.mfu:.1%} (bound {r.estimate.mfu_serial:.1%} .. {r.estimate.mfu_overlapped:.1%})"  # type: ignore[union-attr]
        )
    return lines


def _winner(advice: Advice) -> list[str]:
    """The winner, and the published run of this model on as many chips beside it."""
    w = advice.winner
    if w is None:
        return ["no candidate fits: see docs/plan.md"]
    r = w.report
    lines = [
        f"winner: {w.candidate.strategy} {w.candidate.label()}: predicted {r.step_seconds:.2f} s a step, "  # type: ignore[union-attr]
        f"MFU {r.mfu:.1%}"  # type: ignore[union-attr]
    ]
    published = advice.published()
    if published:
        lines.append(f"  published beside it: {published}")
    return lines


def advice_table(advice: Advice) -> str:
    """The ranking, the largest batches, the winner and the published figure beside it."""
    lines = [
        f"advisor: {advice.model} on {advice.topology} x {advice.slices} slice(s), seq {advice.seq_len}, "
        f"{advice.compute_dtype}{_weights(advice)}, attention {advice.attention}{_fused(advice)}; "
        f"budget {advice.hbm_bytes / GIB:.2f} GiB per device",
        "",
        f"  {'#':>2s}  {'plan':{_WIDTH}s} {'GiB/dev':>9s} {'step ms':>9s} {'tok/s/dev':>11s} {'MFU':>9s} "
        f"{'MFU bound':>15s}  verdict",
    ]
    lines += [_row(rank, o) for rank, o in enumerate(advice.outcomes, 1)]
    lines += _largest(advice)
    lines += [
        "",
        "ranked by predicted MFU, plans that fit first (the model of the compiled program; the roofline "
        "bound beside it: docs/plan.md)",
        *advice.notes,
    ]
    return "\n".join(lines + _winner(advice))


def _weights(advice: Advice) -> str:
    return f" ({advice.weight_dtype} weights)" if advice.weight_dtype != "float32" else ""


def _fused(advice: Advice) -> str:
    return f", fused {' and '.join(advice.fused)} projections" if advice.fused else ""


def _mesh_lines(advice: Advice, mesh: dict[str, int]) -> tuple[str, str]:
    shape, spans = split_dcn(mesh, advice.slices)
    names, sizes = tuple(shape), tuple(shape.values())
    if advice.slices > 1:
        dcn = tuple(spans.get(a, 1) for a in names)
        ici = tuple(s // d for s, d in zip(sizes, dcn, strict=True))
        return (
            "from mesh import HybridMesh",
            f"mesh = HybridMesh(ici_mesh_shape={ici}, dcn_mesh_shape={dcn}, axis_names={names})",
        )
    return "from mesh import Mesh", f"mesh = Mesh(np.arange({math.prod(sizes)}), {sizes}, {names})"


def _checkpoints_layers(remat: Remat | CustomRemat) -> bool:
    """Whether the winner's code checkpoints each layer (fsdp_xla's ``gradient_checkpointing``):
    for ``full`` and ``offload``, and for a per-tensor policy, which fsdp_xla cannot run as it
    is and runs within the memory it planned only by keeping less."""
    return isinstance(remat, CustomRemat) or remat.checkpoints_block


def _fsdp_lines(advice: Advice, o: Outcome, third_party: list[str], ours: list[str]) -> list[str]:
    c = o.candidate
    ours.append("from fsdp_xla import FSDP, MixedPrecision, transformer_auto_wrap_policy")
    if advice.block_class:
        module, _, cls = advice.block_class.rpartition(".")
        third_party.append(f"from {module} import {cls}")
        policy = f"transformer_auto_wrap_policy({{{cls}}})"
    else:
        policy = "None  # no repeated block found: one unit"
    args = ["    mesh=mesh,", f"    auto_wrap_policy={policy},"]
    if advice.compute_dtype == "bfloat16":
        args.append("    mixed_precision=MixedPrecision(torch.bfloat16),")
    remat = Remat.parse(c.remat)
    if _checkpoints_layers(remat):
        args.append("    gradient_checkpointing=True,")
    body = []
    if remat is Remat.OFFLOAD:
        body.append("# the plan offloads each layer's input to host memory; fsdp_xla checkpoints layers on device")
    elif isinstance(remat, CustomRemat):
        body.append(
            f"# the plan keeps tensors one by one ({remat.value}); fsdp_xla has no per-tensor policy and "
            "checkpoints whole layers: their inputs only, on device"
        )
    if c.strategy == "2d":
        plan_fn = "gpt2_plan" if advice.model_type == "gpt2" else "llama_plan"
        ours.append(f"from fsdp_xla.hf import {plan_fn}")
        args.append(f"    param_spec_fn={plan_fn}().param_spec_fn(mesh),")
    if advice.weight_dtype == "bfloat16":  # the plan's arguments: parameters and AdamW's state as stored
        body.append("model = model.to(torch.bfloat16)  # the plan stores the weights in bf16 (--weight-dtype)")
    if advice.fused:
        body.append(
            f"# the plan ran the {' and '.join(advice.fused)} projections as one matmul each (--fused); the model "
            "as built runs them apart: fuse them in its forward for the planned program"
        )
    body += ["model = FSDP(", "    model,", *args, ")"]
    if c.strategy == "2d":
        body.append(
            f"# or the Trainer: FSDPTrainer(model=model, args=args, mesh=mesh, sharding_plan={plan_fn}()) "
            "with the fsdp_config.json below"
        )
    return body


def _sequence_entry(shape: dict[str, int]) -> str | None:
    return Role.CONTEXT.value if Role.CONTEXT.value in shape else None


def _context_lines(shape: dict[str, int]) -> list[str]:
    """What the code cannot say of a context-parallel winner (`spmd.plan.request.context`)."""
    if Role.CONTEXT.value not in shape:
        return []
    c = shape[Role.CONTEXT.value]
    return [
        f"# context parallelism: each sequence split over context={c} in load-balanced order (chunks i and "
        f"{2 * c - 1}-i of {2 * c}, positions",
        "# reordered alike), parameters over fsdp x context, and each attention layer all-gathering K and V "
        "over context:",
        "# fsdp_xla has no context-parallel attention; the plan is MaxText's context_parallel_strategy=all_gather",
    ]


def winner_code(advice: Advice) -> str:
    """The winner as a training-script fragment for `fsdp_xla` / `spmd`."""
    w = advice.winner
    if w is None:
        return "# no candidate fits the budget"
    c = w.candidate
    shape = c.whole_mesh
    axes = batch_axes(shape)
    third_party, ours = ["import numpy as np", "import torch"], ["from spmd import P, mark_sharding"]
    mesh_import, mesh_line = _mesh_lines(advice, c.mesh_shape)
    ours.append(mesh_import)
    body = [mesh_line]
    if c.strategy == "dp":
        body.append("# data parallel: the model replicated on every device (no FSDP wrapping)")
    else:
        body += _fsdp_lines(advice, w, third_party, ours)
    if advice.attention == "flash":
        body.append("# attention: the plan runs a flash (splash) kernel for scaled_dot_product_attention")
    body += [
        f"# each step: {c.global_batch} sequences of {advice.seq_len} tokens ({c.per_device_batch} per batch shard)",
        *_context_lines(shape),
        f"mark_sharding(input_ids, mesh, {P(axes[0] if len(axes) == 1 else axes, _sequence_entry(shape))!r})",
    ]
    isort = lambda line: (line.startswith("from"), line)  # noqa: E731
    return "\n".join([*sorted(third_party, key=isort), "", *sorted(ours), "", *body])
