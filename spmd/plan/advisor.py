"""`advise`: enumerate sharding plans for a model and a TPU topology, compile each with the TPU
compiler, drop those that do not fit, rank the rest by estimated throughput, and write the
winner as code (the `fsdp_xla.FSDP` call, or the 2-D `sharding_plan`) and as an
``fsdp_config.json`` for the Hugging Face Trainer.

Candidates are strategy x mesh x per-device batch x gradient checkpointing:
- ``fsdp``: ``fsdp`` over each slice's chips (``data`` over slices);
- ``2d``: ``fsdp`` x ``tensor`` for each ``tensor`` size that divides a slice's chips and the
  model's attention heads;
- ``dp``: one ``data`` axis over every chip.

Not every candidate is compiled. One whose parameters and AdamW state alone (our sharding math,
exact up to tile padding) exceed the budget is dropped unseen. For each mesh, per-device batches
run smallest first; checkpointing is compiled only when the same batch does not fit without it
(with it the step is only slower), and once neither fits, larger batches are not tried. Compiles
are cached on disk by everything that determines them, so a second ``--advise`` is instant.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from spmd.atomic_file import atomic_write
from spmd.partition_spec import P
from spmd.plan.api import (
    STRATEGIES,
    PlanError,
    _block_bytes,
    build_mesh,
    param_spec_for,
    plan,
    resolve_seq_len,
    tpu_devices,
    uneven_splits,
)
from spmd.plan.lowering import find_layer_stack
from spmd.plan.models import BUILTIN_CONFIGS, build_meta_model
from spmd.plan.report import GIB, PlanReport
from spmd.plan.topology import TpuSlice, parse_slice

__all__ = ["Advice", "Candidate", "Outcome", "advise", "candidates_for", "default_cache_dir"]


@dataclass(frozen=True)
class Candidate:
    """One plan to try: strategy, mesh axis sizes, sequences per batch shard, checkpointing."""

    strategy: str
    mesh: tuple[tuple[str, int], ...]
    per_device_batch: int
    gradient_checkpointing: bool = False

    @property
    def mesh_shape(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def global_batch(self) -> int:
        """Per-device batch times the batch shards (every axis but ``tensor``)."""
        return self.per_device_batch * math.prod(s for a, s in self.mesh if a != "tensor")

    def label(self) -> str:
        mesh = ",".join(f"{a}={s}" for a, s in self.mesh)
        ckpt = " +ckpt" if self.gradient_checkpointing else ""
        return f"{self.strategy:4s} {mesh:24s} batch {self.per_device_batch}/dev{ckpt}"


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


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/xla-spmd/plan`` (``~/.cache/...``)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "xla-spmd" / "plan"


def candidates_for(
    target: TpuSlice, strategies: Sequence[str], tensors: Sequence[int], heads: int | None
) -> list[tuple[str, dict[str, int]]]:
    """The (strategy, mesh) pairs the advisor tries on ``target`` (module docstring)."""
    per_slice = target.chips_per_slice
    data = {"data": target.slices} if target.slices > 1 else {}
    out: list[tuple[str, dict[str, int]]] = []
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise PlanError(f"Unknown strategy {strategy!r}; known: {STRATEGIES}.")
        if strategy == "fsdp":
            out.append(("fsdp", {**data, "fsdp": per_slice}))
        elif strategy == "dp":
            out.append(("dp", {"data": target.chips}))
        else:
            for t in tensors:
                if 1 < t < per_slice and per_slice % t == 0 and (heads is None or heads % t == 0):
                    out.append(("2d", {**data, "fsdp": per_slice // t, "tensor": t}))
    return out


@dataclass(frozen=True)
class Advice:
    """The advisor's result: every candidate's outcome, fitting ones first, best first."""

    model: str
    topology: str
    slices: int
    seq_len: int
    compute_dtype: str
    hbm_bytes: int
    outcomes: tuple[Outcome, ...]
    block_class: str | None = None
    model_type: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def winner(self) -> Outcome | None:
        return self.outcomes[0] if self.outcomes and self.outcomes[0].fits else None

    def table(self) -> str:
        lines = [
            f"advisor: {self.model} on {self.topology} x {self.slices} slice(s), seq {self.seq_len}, "
            f"{self.compute_dtype}; budget {self.hbm_bytes / GIB:.2f} GiB per chip",
            "",
            f"  {'#':>2s}  {'plan':52s} {'GiB/chip':>9s} {'step ms':>9s} {'tok/s/chip':>11s} {'MFU bound':>9s}  verdict",
        ]
        for rank, o in enumerate(self.outcomes, 1):
            r = o.report
            if r is None:
                lines.append(
                    f"  {rank:2d}  {o.candidate.label():52s} {'':>9s} {'':>9s} {'':>11s} {'':>9s}  {o.skipped}"
                )
                continue
            verdict = r.memory.short_verdict()
            if r.memory.compiler_oom_bytes is None:  # the compiler's OOM leaves no program to estimate
                estimate = (
                    f"{r.estimate.step_seconds_serial * 1e3:9.1f} {r.tokens_per_second / r.chips:11.0f} "
                    f"{r.estimate.mfu_serial:9.1%}"
                )
            else:
                estimate = f"{'-':>9s} {'-':>11s} {'-':>9s}"
            lines.append(
                f"  {rank:2d}  {o.candidate.label():52s} {r.memory.total_bytes / GIB:9.2f} "
                f"{estimate}  {verdict}{' (cached)' if o.cached else ''}"
            )
        lines.append("")
        lines.append(
            "ranked by estimated tokens/s with no communication hidden (the conservative end of the estimate; "
            "docs/plan.md)"
        )
        lines += list(self.notes)
        w = self.winner
        lines.append(
            f"winner: {w.candidate.label()}" if w else "no candidate fits: see docs/plan.md for what to change"
        )
        return "\n".join(lines)

    def code(self) -> str:
        """The winner as a training-script fragment for `fsdp_xla` / `spmd`."""
        w = self.winner
        if w is None:
            return "# no candidate fits the budget"
        c = w.candidate
        shape = c.mesh_shape
        names = tuple(shape)
        sizes = tuple(shape.values())
        chips = math.prod(sizes)
        batch_axes = tuple(a for a in names if a != "tensor")
        batch_spec = P(batch_axes[0] if len(batch_axes) == 1 else batch_axes, None)
        third_party = ["import numpy as np", "import torch"]
        ours = ["from spmd import P, mark_sharding"]
        body: list[str] = []
        if self.slices > 1:
            ici = tuple(s // self.slices if a == "data" else s for a, s in shape.items())
            dcn = tuple(self.slices if a == "data" else 1 for a in names)
            ours.append("from mesh import HybridMesh")
            body.append(f"mesh = HybridMesh(ici_mesh_shape={ici}, dcn_mesh_shape={dcn}, axis_names={names})")
        else:
            ours.append("from mesh import Mesh")
            body.append(f"mesh = Mesh(np.arange({chips}), {sizes}, {names})")
        if c.strategy == "dp":
            third_party.append("import torch_xla")
            body.append("model = model.to(torch_xla.device())  # replicated on every chip")
        else:
            ours.append("from fsdp_xla import FSDP, MixedPrecision, transformer_auto_wrap_policy")
            if self.block_class:
                module, _, cls = self.block_class.rpartition(".")
                third_party.append(f"from {module} import {cls}")
                policy = f"transformer_auto_wrap_policy({{{cls}}})"
            else:
                policy = "None  # no repeated block found: one unit"
            args = ["    mesh=mesh,", f"    auto_wrap_policy={policy},"]
            if self.compute_dtype == "bfloat16":
                args.append("    mixed_precision=MixedPrecision(torch.bfloat16),")
            if c.gradient_checkpointing:
                args.append("    gradient_checkpointing=True,")
            if c.strategy == "2d":
                plan_fn = "gpt2_plan" if self.model_type == "gpt2" else "llama_plan"
                ours.append(f"from fsdp_xla.hf import {plan_fn}")
                args.append(f"    param_spec_fn={plan_fn}().param_spec_fn(mesh),")
            body += ["model = FSDP(", "    model,", *args, ")"]
            if c.strategy == "2d":
                body.append(
                    f"# or the Trainer: FSDPTrainer(model=model, args=args, mesh=mesh, sharding_plan={plan_fn}()) "
                    "with the fsdp_config.json below"
                )
        body += [
            f"# each step: {c.global_batch} sequences of {self.seq_len} tokens ({c.per_device_batch} per batch shard)",
            f"mark_sharding(input_ids, mesh, {batch_spec!r})",
        ]
        isort = lambda line: (line.startswith("from"), line)  # noqa: E731
        lines = [*sorted(third_party, key=isort), "", *sorted(ours), "", *body]
        return "\n".join(lines)

    def fsdp_config(self) -> dict[str, Any] | None:
        """The winner as a Trainer ``fsdp_config`` (``None`` for data parallel, which is not FSDP)."""
        w = self.winner
        if w is None or w.candidate.strategy == "dp":
            return None
        config: dict[str, Any] = {"xla": True, "xla_fsdp_v2": True}
        if self.block_class:
            config["transformer_layer_cls_to_wrap"] = [self.block_class.rpartition(".")[2]]
        config["xla_fsdp_grad_ckpt"] = w.candidate.gradient_checkpointing
        if self.compute_dtype == "bfloat16":
            config["xla_fsdp_settings"] = {"compute_dtype": "bfloat16"}
        return config

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "topology": self.topology,
            "slices": self.slices,
            "seq_len": self.seq_len,
            "compute_dtype": self.compute_dtype,
            "hbm_bytes": self.hbm_bytes,
            "winner": None if self.winner is None else self.winner.candidate.label(),
            "code": self.code(),
            "fsdp_config": self.fsdp_config(),
            "outcomes": [
                {
                    "strategy": o.candidate.strategy,
                    "mesh": o.candidate.mesh_shape,
                    "per_device_batch": o.candidate.per_device_batch,
                    "global_batch": o.candidate.global_batch,
                    "gradient_checkpointing": o.candidate.gradient_checkpointing,
                    "skipped": o.skipped,
                    "cached": o.cached,
                    "report": None if o.report is None else o.report.to_dict(),
                }
                for o in self.outcomes
            ],
        }


def _model_key(model: Any) -> str | None:
    """What identifies the model for the compile cache (``None``: do not cache)."""
    if isinstance(model, str) and model in BUILTIN_CONFIGS:
        return f"builtin:{model}:{json.dumps(BUILTIN_CONFIGS[model], sort_keys=True)}"
    if isinstance(model, (str, Path)) and Path(model).is_file():
        return "file:" + hashlib.sha256(Path(model).read_bytes()).hexdigest()
    return None  # factories and modules: their code can change under the same name


def _versions() -> str:
    import importlib.metadata as md

    found = []
    for dist in ("jax", "libtpu", "torchax", "torch", "transformers", "xla-spmd"):
        try:
            found.append(f"{dist}={md.version(dist)}")
        except md.PackageNotFoundError:
            found.append(f"{dist}=?")
    return ",".join(found)


def _plan_kwargs(c: Candidate, seq_len: int, compute_dtype: str, slices: int) -> dict[str, Any]:
    return dict(
        strategy=c.strategy,
        mesh=c.mesh_shape,
        global_batch=c.global_batch,
        seq_len=seq_len,
        compute_dtype=compute_dtype,
        gradient_checkpointing=c.gradient_checkpointing,
        slices=slices,
    )


def _run_chain(
    model: Any,
    topology: str,
    chain: list[list[Candidate]],
    seq_len: int,
    compute_dtype: str,
    slices: int,
    hbm_bytes: int,
    cache_dir: Path | None,
    model_key: str | None,
    log: Callable[[str], None],
) -> list[Outcome]:
    """Compile one mesh's candidates: batches smallest first; at each, checkpointing only when
    the plain step does not fit; stop once a batch fits neither way."""
    outcomes: list[Outcome] = []
    versions = _versions() if cache_dir is not None and model_key is not None else ""
    for at_batch in chain:
        fitted = False
        for c in at_batch:
            kwargs = _plan_kwargs(c, seq_len, compute_dtype, slices)
            path = None
            if versions:
                key = json.dumps([model_key, topology, kwargs, versions], sort_keys=True)
                path = cache_dir / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")
            if path is not None and path.is_file():
                report = PlanReport.from_dict(json.loads(path.read_text())).with_hbm(hbm_bytes)
                outcome = Outcome(c, report, cached=True)
            else:
                try:
                    report = plan(model, topology, hbm_bytes=hbm_bytes, **kwargs)
                except PlanError as e:
                    outcomes.append(Outcome(c, skipped=f"not compiled: {e}"))
                    log(f"  {c.label()}: not compiled: {e}")
                    continue
                if path is not None:
                    with atomic_write(path) as tmp:
                        tmp.write_text(json.dumps(report.to_dict()))
                outcome = Outcome(c, report)
            outcomes.append(outcome)
            r = outcome.report
            log(
                f"  {c.label()}: {r.memory.total_bytes / GIB:.2f} GiB/chip, "
                f"{'fits' if r.fits else 'OOM'}, {'cached' if outcome.cached else f'compiled in {r.compile_seconds:.0f} s'}"
            )
            if r.fits:
                fitted = True
                break
        if not fitted:
            break
    return outcomes


def _chain_in_worker(args: tuple[Any, ...]) -> list[Outcome]:
    return _run_chain(*args, log=lambda line: print(line, file=sys.stderr, flush=True))


def advise(
    model: str | Path | torch.nn.Module,
    topology: str,
    *,
    slices: int = 1,
    strategies: Sequence[str] = STRATEGIES,
    per_device_batches: Iterable[int] = (1, 2, 4),
    tensors: Iterable[int] = (2, 4, 8),
    checkpointing: Iterable[bool] = (False, True),
    seq_len: int | None = None,
    compute_dtype: str = "bfloat16",
    hbm_bytes: int | None = None,
    jobs: int = 1,
    cache_dir: Path | str | None = None,
    log: Callable[[str], None] | None = None,
) -> Advice:
    """Try the candidate plans (module docstring) and rank them.

    Args:
        model: as in `spmd.plan.plan`.
        topology: as in `spmd.plan.plan`.
        slices: as in `spmd.plan.plan`.
        seq_len: as in `spmd.plan.plan`.
        compute_dtype: as in `spmd.plan.plan`.
        strategies: which of ``fsdp``, ``2d``, ``dp`` to try.
        per_device_batches: sequences per batch shard to try.
        tensors: ``tensor`` axis sizes for 2-D.
        checkpointing: gradient checkpointing settings to try (``(False,)``: never).
        hbm_bytes: the per-chip memory budget; default the chip's HBM.
        jobs: meshes compiled at once, each in its own spawned process (about 2 GiB of RAM
            each; a calling script needs an ``if __name__ == "__main__":`` guard); 1 runs in
            this process.
        cache_dir: where compiles are cached; ``None`` turns caching off.
        log: receives one progress line per compile (default: stderr).

    Raises:
        PlanError, TopologyError, ModelSpecError: bad input, with what to change.
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    target = parse_slice(topology, slices)
    budget = target.chip.hbm_bytes if hbm_bytes is None else hbm_bytes
    batches = sorted(set(per_device_batches))
    if not batches or batches[0] < 1:
        raise PlanError(f"per_device_batches must be positive integers, got {batches}.")
    ckpt_order = sorted(set(checkpointing))  # False first: checkpointing only when needed
    if not ckpt_order:
        raise PlanError("checkpointing must name at least one setting, e.g. (False, True).")
    module, hf_config = build_meta_model(model)
    seq_len = resolve_seq_len(seq_len, hf_config)
    heads = getattr(hf_config, "num_attention_heads", None) or getattr(hf_config, "n_head", None)
    stack = find_layer_stack(module)
    block_class = None
    if stack is not None:
        cls = type(stack[1][0])
        block_class = f"{cls.__module__}.{cls.__qualname__}"
    meshes = candidates_for(target, strategies, tuple(tensors), heads)
    if not meshes:
        raise PlanError(
            f"No candidate to compile: strategies {list(strategies)} with tensor sizes {list(tensors)} give no mesh "
            f"on {target.name} (a 2-D tensor size must be between 2 and {target.chips_per_slice - 1}, divide the "
            f"{target.chips_per_slice} chips of a slice"
            + (f" and the model's {heads} attention heads)" if heads else ")")
            + ". Add 'fsdp' or 'dp' to the strategies, or give other tensor sizes."
        )
    devices = tpu_devices(target)
    params = {n: tuple(p.shape) for n, p in module.named_parameters()}
    outcomes: list[Outcome] = []
    chains: list[list[list[Candidate]]] = []
    for strategy, shape in meshes:
        mesh_items = tuple(shape.items())
        our_mesh = build_mesh(shape, target, devices)
        spec_fn = param_spec_for(strategy, our_mesh, hf_config)
        uneven = uneven_splits(params, spec_fn, our_mesh)
        if uneven:
            c = Candidate(strategy, mesh_items, batches[0], False)
            listed = "; ".join(uneven[:2]) + (f"; {len(uneven) - 2} more" if len(uneven) > 2 else "")
            outcomes.append(Outcome(c, skipped=f"not compiled: unequal blocks ({listed}); JAX needs even splits"))
            log(f"  {c.label()}: skipped, unequal blocks: {listed}")
            continue
        state = 3 * sum(_block_bytes(s, spec_fn(n, s), our_mesh, 4) for n, s in params.items())
        if state > budget:
            c = Candidate(strategy, mesh_items, batches[0], False)
            outcomes.append(
                Outcome(
                    c,
                    skipped=f"not compiled: parameters + AdamW state alone take {state / GIB:.2f} GiB/chip "
                    f"(our sharding math) > {budget / GIB:.2f} GiB",
                )
            )
            log(f"  {c.label()}: skipped, state alone {state / GIB:.2f} GiB/chip")
            continue
        chains.append([[Candidate(strategy, mesh_items, b, ck) for ck in ckpt_order] for b in batches])

    model_key = _model_key(model)
    cache = Path(cache_dir) if cache_dir is not None else None
    log(
        f"advisor: {len(chains)} meshes to compile, per-device batches {batches} each, checkpointing "
        f"{'only where needed' if len(ckpt_order) > 1 else ckpt_order[0]}"
    )
    common = (topology, seq_len, compute_dtype, slices, budget, cache, model_key)
    if jobs > 1 and len(chains) > 1 and not isinstance(model, torch.nn.Module):
        # spawn, not fork: this process has libtpu loaded (its threads), and a forked child aborts.
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(chains)), mp_context=spawn) as pool:
            futures = [pool.submit(_chain_in_worker, (model, common[0], ch, *common[1:])) for ch in chains]
            for k, fut in enumerate(futures, 1):
                outcomes += fut.result()
                log(f"[{k}/{len(chains)} meshes done]")
    else:
        for k, ch in enumerate(chains, 1):
            outcomes += _run_chain(
                module if isinstance(model, torch.nn.Module) else model, common[0], ch, *common[1:], log=log
            )
            log(f"[{k}/{len(chains)} meshes done]")

    def rank(o: Outcome) -> tuple[int, float]:
        if o.report is None:
            return (2, 0.0)
        return (0 if o.fits else 1, -o.report.tokens_per_second)

    notes = []
    if not any(o.fits for o in outcomes):
        tries = [] if True in ckpt_order else ["gradient checkpointing (leave out --no-checkpointing)"]
        tries += ["a shorter --seq", "more chips"]
        if "2d" not in strategies:
            tries.append("a 2-D mesh (--strategies fsdp,2d)")
        notes.append("nothing fits: try " + ", ".join(tries))
    return Advice(
        model=str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__,
        topology=target.name,
        slices=target.slices,
        seq_len=seq_len,
        compute_dtype=compute_dtype,
        hbm_bytes=budget,
        outcomes=tuple(sorted(outcomes, key=rank)),
        block_class=block_class,
        model_type=getattr(hf_config, "model_type", None),
        notes=tuple(notes),
    )
