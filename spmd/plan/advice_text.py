"""An `Advice` as text: the ranking table and the winner as a training-script fragment."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from spmd.plan.remat import Remat
from spmd.plan.report import GIB
from spmd.sharding._partition_spec import P

if TYPE_CHECKING:
    from spmd.plan.advice import Advice, Outcome

__all__ = ["advice_table", "winner_code"]

_WIDTH = 50


def _row(rank: int, o: Outcome) -> str:
    label = f"{o.candidate.strategy:4s} {o.candidate.label()}"
    r = o.report
    if r is None:
        return f"  {rank:2d}  {label:{_WIDTH}s} {'':>9s} {'':>9s} {'':>11s} {'':>9s}  {o.skipped}"
    if r.memory.compiler_oom_bytes is None:  # the compiler's OOM leaves no program to estimate
        e = r.estimate
        estimate = f"{e.step_seconds_serial * 1e3:9.1f} {r.tokens_per_second / r.devices:11.0f} {e.mfu_serial:9.1%}"
    else:
        estimate = f"{'-':>9s} {'-':>11s} {'-':>9s}"
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
            f"/device, MFU bound {r.estimate.mfu_serial:.1%} .. {r.estimate.mfu_overlapped:.1%}"  # type: ignore[union-attr]
        )
    return lines


def advice_table(advice: Advice) -> str:
    """The ranking, the largest batches, the published figure and the winner."""
    lines = [
        f"advisor: {advice.model} on {advice.topology} x {advice.slices} slice(s), seq {advice.seq_len}, "
        f"{advice.compute_dtype}, attention {advice.attention}; budget {advice.hbm_bytes / GIB:.2f} GiB per device",
        "",
        f"  {'#':>2s}  {'plan':{_WIDTH}s} {'GiB/dev':>9s} {'step ms':>9s} {'tok/s/dev':>11s} {'MFU bound':>9s}  verdict",
    ]
    lines += [_row(rank, o) for rank, o in enumerate(advice.outcomes, 1)]
    lines += _largest(advice)
    lines += [
        "",
        "ranked by estimated tokens/s with no communication hidden (the conservative end of the estimate; "
        "docs/plan.md)",
        *advice.notes,
    ]
    published = advice.published()
    if published:
        lines.append(f"published: {published}")
    w = advice.winner
    lines.append(
        f"winner: {w.candidate.strategy} {w.candidate.label()}" if w else "no candidate fits: see docs/plan.md"
    )
    return "\n".join(lines)


def _mesh_lines(advice: Advice, shape: dict[str, int]) -> tuple[str, str]:
    names, sizes = tuple(shape), tuple(shape.values())
    if advice.slices > 1:
        ici = tuple(s // advice.slices if a == "data" else s for a, s in shape.items())
        dcn = tuple(advice.slices if a == "data" else 1 for a in names)
        return (
            "from mesh import HybridMesh",
            f"mesh = HybridMesh(ici_mesh_shape={ici}, dcn_mesh_shape={dcn}, axis_names={names})",
        )
    return "from mesh import Mesh", f"mesh = Mesh(np.arange({math.prod(sizes)}), {sizes}, {names})"


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
    remat = Remat(c.remat)
    if remat.checkpoints_block:
        args.append("    gradient_checkpointing=True,")
    body = []
    if remat is Remat.OFFLOAD:
        body.append("# the plan offloads each layer's input to host memory; fsdp_xla checkpoints layers on device")
    if c.strategy == "2d":
        plan_fn = "gpt2_plan" if advice.model_type == "gpt2" else "llama_plan"
        ours.append(f"from fsdp_xla.hf import {plan_fn}")
        args.append(f"    param_spec_fn={plan_fn}().param_spec_fn(mesh),")
    body += ["model = FSDP(", "    model,", *args, ")"]
    if c.strategy == "2d":
        body.append(
            f"# or the Trainer: FSDPTrainer(model=model, args=args, mesh=mesh, sharding_plan={plan_fn}()) "
            "with the fsdp_config.json below"
        )
    return body


def winner_code(advice: Advice) -> str:
    """The winner as a training-script fragment for `fsdp_xla` / `spmd`."""
    w = advice.winner
    if w is None:
        return "# no candidate fits the budget"
    c = w.candidate
    shape = c.mesh_shape
    axes = tuple(a for a in shape if a != "tensor")
    third_party, ours = ["import numpy as np", "import torch"], ["from spmd import P, mark_sharding"]
    mesh_import, mesh_line = _mesh_lines(advice, shape)
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
        f"mark_sharding(input_ids, mesh, {P(axes[0] if len(axes) == 1 else axes, None)!r})",
    ]
    isort = lambda line: (line.startswith("from"), line)  # noqa: E731
    return "\n".join([*sorted(third_party, key=isort), "", *sorted(ours), "", *body])
