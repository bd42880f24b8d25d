"""`advise`: search sharding plans, remat policies and batches for a model on a TPU topology by
compiling them with the TPU compiler; rank those that fit; write the winner as code.

Candidates are (strategy, mesh) x remat policy x per-device batch:
- ``fsdp``: ``fsdp`` over each slice's devices (``data`` over slices), and ``data`` x ``fsdp``
  for each ``--datas`` size (HSDP: parameters sharded within each ``fsdp`` group);
- ``2d``: ``fsdp`` x ``tensor`` for each ``tensor`` size that divides a slice's devices and the
  model's attention heads;
- ``dp``: one ``data`` axis over every device;
- ``cp``: ``fsdp`` x ``context`` for each ``--contexts`` size (context parallelism: the sequence
  over ``context``, parameters over both; splash attention only, `spmd.plan.request.context`);
- remat policies in order of recomputation, ``none``, ``dots``, ``full``, ``offload``
  (`spmd.plan.request.remat`).

Not every candidate is compiled. A mesh whose parameters and AdamW state alone exceed the budget
is dropped unseen; on the others each policy's largest fitting batch is searched as MaxText's
``estimator.py`` does, with our memory math (`spmd.plan.predict.memory`) ruling out what cannot fit and
choosing the first batch to compile (`spmd.plan.advisor.search`); a remat policy whose MFU ceiling
(`spmd.plan.predict.ceiling`) is below a plan already compiled that fits is not compiled. The searches of different meshes
compile in parallel, in as many worker processes as this machine's cores and free memory allow
(`spmd.plan.advisor.compile_pool`), with progress on stderr; Ctrl-C leaves a partial ranking. Compiles
are cached on disk by everything that determines them (`spmd.plan.advisor.plan_cache`), so a second
``--advise`` compiles nothing.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from mesh import Role
from mesh.checks import is_int
from spmd.plan.advisor.advice import Advice, Candidate, Outcome
from spmd.plan.advisor.compile_pool import default_jobs, run_searches
from spmd.plan.advisor.plan_cache import Settings, default_cache_dir, model_key
from spmd.plan.advisor.refine import Refinement, block_names, refinement
from spmd.plan.advisor.search import Leader, MeshSearch
from spmd.plan.errors import PlanError
from spmd.plan.lower.lowering import find_layer_stack
from spmd.plan.predict.ceiling import mfu_ceiling, runs_its_floor
from spmd.plan.predict.memory import MemoryMath, model_shape, plan_memory
from spmd.plan.report.plan_report import GIB
from spmd.plan.request.attention import Attention
from spmd.plan.request.context import check_context, check_takes_positions
from spmd.plan.request.dcn import DCN_PREFIX, split_dcn
from spmd.plan.request.meshes import ADVISED_STRATEGIES, STRATEGIES, build_mesh, tpu_devices
from spmd.plan.request.models import build_meta_model, resolve_seq_len
from spmd.plan.request.remat import Remat
from spmd.plan.request.settings import PlanSettings
from spmd.plan.request.specs import param_bytes, param_spec_for, state_bytes, uneven_splits
from spmd.plan.request.splash_blocks import SplashBlocks, check_no_context_axis
from spmd.plan.request.topology import TpuSlice

__all__ = ["Advice", "Candidate", "Outcome", "advise", "candidates_for", "default_cache_dir"]

Log = Callable[[str], None]


def candidates_for(
    target: TpuSlice,
    strategies: Sequence[str],
    tensors: Sequence[int],
    heads: int | None,
    datas: Sequence[int] = (1,),
    contexts: Sequence[int] = (),
) -> list[tuple[str, dict[str, int]]]:
    """The (strategy, mesh) pairs the advisor tries on ``target`` (module docstring); ``datas``:
    sizes of a ``data`` axis inside each slice for ``fsdp`` (``data`` x ``fsdp``, HSDP: the
    parameters sharded over ``fsdp`` only, the batch over both); ``contexts``: sizes of the
    ``context`` axis for ``cp``. Across slices, ``fsdp`` and ``2d`` are tried both ways MaxText
    runs them: data parallelism over DCN (a ``data`` axis over the slices) and FSDP over DCN
    (``dcn_fsdp``: parameters sharded over every slice, `spmd.plan.request.dcn`)."""
    per_slice = target.devices_per_slice
    across = {DCN_PREFIX + Role.FSDP.value: target.slices} if target.slices > 1 else None
    data = {Role.DATA.value: target.slices} if target.slices > 1 else {}
    out: list[tuple[str, dict[str, int]]] = []
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise PlanError(f"Unknown strategy {strategy!r}; known: {STRATEGIES}.")
        if strategy == Role.FSDP:
            for d in sorted(set(datas)):
                if 0 < d < per_slice and per_slice % d == 0:
                    inner = {Role.DATA.value: target.slices * d} if target.slices * d > 1 else {}
                    out.append((Role.FSDP.value, {**inner, Role.FSDP.value: per_slice // d}))
            if across is not None:
                out.append((Role.FSDP.value, {**across, Role.FSDP.value: per_slice}))
        elif strategy == "dp":
            out.append(("dp", {Role.DATA.value: target.devices}))
        elif strategy == "cp":
            for c in sorted(set(contexts)):
                if 1 < c < per_slice and per_slice % c == 0:
                    out.append(("cp", {**data, Role.FSDP.value: per_slice // c, Role.CONTEXT.value: c}))
        else:
            for t in tensors:
                if 1 < t < per_slice and per_slice % t == 0 and (heads is None or heads % t == 0):
                    out.append(("2d", {**data, Role.FSDP.value: per_slice // t, Role.TENSOR.value: t}))
                    if across is not None:
                        out.append(("2d", {**across, Role.FSDP.value: per_slice // t, Role.TENSOR.value: t}))
    return out


def _predictor(shape: Any, settings: PlanSettings, mesh: dict[str, int], arguments: int, params: int) -> Any:
    """``(remat, per-device batch) -> MemoryMath`` of one mesh (``None`` for a model of no known shape)."""
    tensor, context = mesh.get(Role.TENSOR.value, 1), mesh.get(Role.CONTEXT.value, 1)
    tokens = 4 * settings.seq_len // context  # type: ignore[operator]  # the int32 batch, per sequence per device

    def predict(remat: str, batch: int) -> MemoryMath | None:
        if shape is None:
            return None
        return plan_memory(
            shape, Remat.parse(remat), settings.attention, settings.seq_len, batch, tensor,  # type: ignore[arg-type]
            arguments + tokens * batch, params, context, settings.vocab_tiles, settings.weight_bytes,
        )  # fmt: skip

    return predict


def _dropped_because(
    uneven: list[str], state: int, budget: int, mesh: dict[str, int], seq_len: int
) -> str:  # fmt: skip
    """Why a mesh is not compiled at all (an empty string: it is searched)."""
    if uneven:
        listed = "; ".join(uneven[:2]) + (f"; {len(uneven) - 2} more" if len(uneven) > 2 else "")
        return f"not compiled: unequal blocks ({listed}); JAX needs even splits"
    if state > budget:
        return (
            f"not compiled: parameters + AdamW state alone take {state / GIB:.2f} GiB/device (our sharding "
            f"math) > {budget / GIB:.2f} GiB"
        )
    try:
        check_context(seq_len, mesh.get(Role.CONTEXT.value, 1))
    except PlanError as e:
        return f"not compiled: {e}"
    return ""


def _ceilings(shape: Any, settings: PlanSettings, remats: tuple[str, ...]) -> Callable[[str], float | None]:
    """``remat -> the highest MFU it or any policy after it can reach``: a search rules out a
    policy with every one after it (`spmd.plan.advisor.search`), so it needs the highest ceiling among them,
    which `save_qkv_context` (tried before the two that keep no attention output, with more
    recomputation of its own below a sequence as long as the width) can make higher than its own."""
    chip = settings.target.chip.libtpu_name
    own = {r: mfu_ceiling(shape, Remat(r), settings.seq_len, chip) for r in remats}  # type: ignore[arg-type]

    def ceiling(remat: str) -> float | None:
        later = [own[r] for r in remats[remats.index(remat) :]]
        return None if any(c is None for c in later) else max(later)  # type: ignore[type-var]

    return ceiling


def _searches(
    module: torch.nn.Module, hf_config: Any, meshes: list[tuple[str, dict[str, int]]], settings: PlanSettings,
    batches: tuple[int, ...], remats: tuple[str, ...], log: Log,
) -> tuple[list[MeshSearch], list[Outcome], Any]:  # fmt: skip
    """A search for each mesh worth compiling, an `Outcome` for each one dropped unseen (module
    docstring), and the model's shape the searches' math reads (`model_shape`)."""
    target, budget = settings.target, settings.budget
    devices = tpu_devices(target)
    params = {n: tuple(p.shape) for n, p in module.named_parameters()}
    shape = model_shape(hf_config, sum(math.prod(s) for s in params.values()))
    searches, dropped, leader = [], [], Leader()  # one leader: a plan of any mesh can beat another's policy
    ceiling = _ceilings(shape, settings, remats)

    def counted(outcome: Outcome) -> bool:
        return runs_its_floor(outcome.report, shape)

    for strategy, mesh in meshes:
        whole, spans = split_dcn(mesh, target.slices)  # a data axis over the slices, or dcn_fsdp
        our_mesh = build_mesh(whole, target, devices, spans)
        spec_fn = param_spec_for(strategy, our_mesh, hf_config)
        state = state_bytes(params, spec_fn, our_mesh, settings.moment_bytes, settings.weight_bytes)
        why = _dropped_because(uneven_splits(params, spec_fn, our_mesh), state, budget, mesh, settings.seq_len)  # type: ignore[arg-type]
        if why:
            dropped.append(Outcome(Candidate(strategy, tuple(mesh.items()), batches[0], remats[0]), skipped=why))
            log(f"  {strategy} {dict(mesh)}: {why}")
            continue
        weights = param_bytes(params, spec_fn, our_mesh, settings.weight_bytes)
        predict = _predictor(shape, settings, mesh, state, weights)
        searches.append(
            MeshSearch(strategy, tuple(mesh.items()), batches, remats, budget, predict, ceiling, leader, counted)
        )
    return searches, dropped, shape


@dataclass(frozen=True)
class _Choices:
    """What the advisor tries, checked: strategies, batches, remat policies, tensor, data and context
    sizes, and how many per-tensor variants of the winner's policy (``refine``)."""

    strategies: tuple[str, ...]
    batches: tuple[int, ...]
    policies: tuple[str, ...]
    tensors: tuple[int, ...]
    datas: tuple[int, ...]
    contexts: tuple[int, ...] = ()
    refine: int = 0


def _names(values: Iterable[Any] | str) -> list[Any]:
    """A list of names; one string may hold several, comma-separated (``"fsdp,2d"``)."""
    return [v.strip() for v in values.split(",")] if isinstance(values, str) else list(values)


def _sizes(name: str, values: Iterable[int]) -> tuple[int, ...]:
    given = list(values)
    if not given or any(not is_int(v) or not 1 <= v <= 2**31 for v in given):
        raise PlanError(f"{name} must be positive integers, got {given!r:.200}.")
    return tuple(sorted(set(given)))


def _check_choices(
    strategies: Sequence[str] | str,
    per_device_batches: Iterable[int],
    remats: Iterable[str | Remat] | str,
    tensors: Iterable[int],
    datas: Iterable[int],
    jobs: int | None,
    contexts: Iterable[int] = (2, 4, 8),
    refine: int = 0,
) -> _Choices:
    """The choices to try, checked before any compile (the shared settings check themselves)."""
    if jobs is not None and (not is_int(jobs) or not 1 <= jobs <= 64):
        raise PlanError(f"jobs must be a whole number from 1 to 64 (compiles at once) or None, got {jobs!r:.60}.")
    if not is_int(refine) or not 0 <= refine <= 64:
        raise PlanError(
            f"refine must be a whole number from 0 to 64 (per-tensor remat variants of the winner to search; "
            f"0: presets only), got {refine!r:.60}."
        )
    policies = sorted({Remat.parse(r) for r in _names(remats)}, key=list(Remat).index)
    if not policies:
        raise PlanError(f"remats must name at least one policy of {[r.value for r in Remat]}.")
    return _Choices(
        tuple(_names(strategies)),
        _sizes("per_device_batches", per_device_batches),
        tuple(p.value for p in policies),
        _sizes("tensors", tensors),
        _sizes("datas", datas),
        _sizes("contexts", contexts),
        refine,
    )


def _check_context_parallel(module: torch.nn.Module, attention: Attention) -> None:
    """Raise `PlanError`, before any compile, where the ``cp`` strategy cannot plan this model."""
    if attention is not Attention.FLASH:
        raise PlanError(
            "Strategy 'cp' splits the sequence over a context axis, which the planner plans with splash attention "
            "only (its load-balanced causal mask). Add --attention flash, or leave 'cp' out of --strategies."
        )
    check_takes_positions(module)


def _no_mesh_error(target: TpuSlice, choose: _Choices, heads: int | None) -> PlanError:
    per_slice = target.devices_per_slice
    return PlanError(
        f"No candidate to compile: strategies {list(choose.strategies)} with tensor sizes {list(choose.tensors)} "
        f"and context sizes {list(choose.contexts)} give no mesh on {target.name} (a 2-D tensor size, or a cp "
        f"context size, must be between 2 and {per_slice - 1} and divide the {per_slice} devices of a slice"
        + (f"; a tensor size the model's {heads} attention heads too)" if heads else ")")
        + ". Add 'fsdp' or 'dp' to the strategies, or give other tensor or context sizes."
    )


def _meshes(target: TpuSlice, choose: _Choices, hf_config: Any) -> list[tuple[str, dict[str, int]]]:
    heads = getattr(hf_config, "num_attention_heads", None) or getattr(hf_config, "n_head", None)
    meshes = candidates_for(target, choose.strategies, choose.tensors, heads, choose.datas, choose.contexts)
    if not meshes:
        raise _no_mesh_error(target, choose, heads)
    return meshes


def _model(
    model: Any, given: PlanSettings, context_parallel: bool = False
) -> tuple[torch.nn.Module, Any, PlanSettings]:
    """The model on ``meta``, its config, and ``given`` with the sequence the plans run (checked
    for context parallelism when the search has ``cp``, and by `PlanSettings.check_model_sequence`
    and `PlanSettings.check_model`)."""
    if context_parallel:
        check_no_context_axis(given.splash_blocks)  # type: ignore[arg-type]
    module, hf_config = build_meta_model(model)
    if context_parallel:
        _check_context_parallel(module, given.attention)  # type: ignore[arg-type]
    seq = resolve_seq_len(given.seq_len, hf_config)
    # the model's default sequence: the new settings check their tiles and given blocks against it;
    # a sequence given was checked when ``given`` was built
    settings = given if seq == given.seq_len else replace(given, seq_len=seq)
    settings.check_model_sequence(seq)
    settings.check_model(module)
    return module, hf_config, settings


def _second_pass(
    outcomes: list[Outcome], searches: list[MeshSearch], module: torch.nn.Module, shape: Any,
    settings: PlanSettings, batches: tuple[int, ...], limit: int,
) -> Refinement:  # fmt: skip
    """The per-tensor variants of the first pass's winner to search (`spmd.plan.advisor.refine`);
    none when nothing fits. ``shape``: the model's (`model_shape`), as the first pass read it."""
    fits = [o for o in outcomes if o.fits]
    if not fits or limit <= 0:
        return Refinement((), ())
    winner = max(fits, key=lambda o: o.report.mfu)  # type: ignore[union-attr]
    c = winner.candidate
    search = next(s for s in searches if (s.strategy, s.mesh) == (c.strategy, c.mesh))
    chip = settings.target.chip.libtpu_name

    def ceiling(remat: str) -> float | None:
        return mfu_ceiling(shape, Remat.parse(remat), settings.seq_len, chip)  # type: ignore[arg-type]

    names = block_names(module, settings.attention is Attention.FLASH)
    return refinement(winner, search, names, batches, ceiling, limit, runs_its_floor(winner.report, shape))


def _run_second_pass(
    second: Refinement, outcomes: list[Outcome], source: Any, run: Settings, workers: int, log: Log
) -> bool:  # fmt: skip
    """Search ``second``'s variants, adding what they find (and what they leave out) to
    ``outcomes``; whether Ctrl-C stopped them."""
    if not (second.searches or second.skipped):
        return False
    winner = _rank(outcomes)[0].candidate
    log(
        f"advisor: per-tensor remat near the winner ({winner.label()}): {len(second.searches)} to search, "
        f"{len(second.skipped)} not compiled"
    )
    interrupted = run_searches(source, list(second.searches), run, workers, log)
    outcomes += list(second.skipped) + [o for s in second.searches for o in s.outcomes]
    return interrupted


def _workers(model: Any, jobs: int | None, searches: list[MeshSearch], batches: tuple[int, ...], log: Log) -> int:
    """Compiles at once (logged): a module cannot be sent to a worker process, so it compiles here."""
    workers = 1 if isinstance(model, torch.nn.Module) else min(jobs or default_jobs(), max(1, len(searches)))
    log(f"advisor: {len(searches)} meshes; batches {list(batches)}; {workers} compile(s) at once")
    return workers


def _advice(
    model: Any, settings: PlanSettings, module: torch.nn.Module, hf_config: Any, outcomes: list[Outcome],
    choose: _Choices, interrupted: bool,
) -> Advice:  # fmt: skip
    """The ranked outcomes as `Advice`, with the winner's code's block class and the notes."""
    name = str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__
    target = settings.target
    return Advice(  # fields in order: model, topology, chip, chips, slices, seq, dtype, attention, budget, ...
        name, target.name, target.chip.name, target.chips, target.slices, settings.seq_len, settings.compute_dtype,
        settings.attention.value, settings.budget, _rank(outcomes), _block_class(module),  # type: ignore[union-attr]
        getattr(hf_config, "model_type", None), _notes(outcomes, choose.policies, choose.strategies, interrupted),
        interrupted, settings.weight_dtype, settings.fused,  # type: ignore[arg-type]
    )  # fmt: skip


def _block_class(module: torch.nn.Module) -> str | None:
    """The repeated block's class, ``module.Class`` (the FSDP wrap policy of the winner's code)."""
    stack = find_layer_stack(module)
    return None if stack is None else f"{type(stack[1][0]).__module__}.{type(stack[1][0]).__qualname__}"


def _rank(outcomes: list[Outcome]) -> tuple[Outcome, ...]:
    """Plans that fit first, by predicted MFU (`PlanReport.mfu`); then those that do not; then
    those not compiled."""

    def key(o: Outcome) -> tuple[int, float]:
        if o.report is None:
            return (2, 0.0)
        return (0 if o.fits else 1, -o.report.mfu)

    return tuple(sorted(outcomes, key=key))


def _notes(outcomes: list[Outcome], remats: tuple[str, ...], strategies: Sequence[str],
           interrupted: bool) -> tuple[str, ...]:  # fmt: skip
    if interrupted:
        return (f"interrupted (Ctrl-C) after {sum(o.report is not None for o in outcomes)} plans: a partial ranking",)
    if any(o.fits for o in outcomes):
        return ()
    tries = [f"--remat {r.value}" for r in Remat if r.value not in remats][:2]
    tries += ["a shorter --seq", "more chips", "--attention flash"]
    if "2d" not in strategies:
        tries.append("a 2-D mesh (--strategies fsdp,2d)")
    return ("nothing fits: try " + ", ".join(tries),)


def advise(
    model: str | Path | torch.nn.Module,
    topology: str,
    *,
    slices: int = 1,
    strategies: Sequence[str] = ADVISED_STRATEGIES,
    per_device_batches: Iterable[int] = (1, 2, 4),
    tensors: Iterable[int] = (2, 4, 8),
    datas: Iterable[int] = (1,),
    contexts: Iterable[int] = (2, 4, 8),
    remats: Iterable[str | Remat] = tuple(r.value for r in Remat),
    attention: str | Attention = "dot",
    seq_len: int | None = None,
    compute_dtype: str = "bfloat16",
    hbm_bytes: int | None = None,
    moment_dtype: str = "float32",
    vocab_tiles: int = 1,
    splash_blocks: str | SplashBlocks | None = None,
    scoped_vmem_kib: int | None = None,
    weight_dtype: str = "float32",
    fused: str | tuple[str, ...] = (),
    jobs: int | None = None,
    cache_dir: Path | str | None = None,
    log: Log | None = None,
    refine: int = 4,
) -> Advice:
    """Search the candidate plans (module docstring) and rank them. ``model`` to ``fused``
    are `spmd.plan.plan`'s settings (one `PlanSettings`, shared by every candidate).

    Args:
        strategies: which of ``fsdp``, ``2d``, ``dp``, ``cp`` to try (default the first three).
        per_device_batches: sequences per batch shard to try.
        tensors: ``tensor`` axis sizes for 2-D.
        datas: ``data`` axis sizes within a slice for ``fsdp`` (``data`` x ``fsdp``); 1: none.
        contexts: ``context`` axis sizes for ``cp`` (``fsdp`` x ``context``).
        remats: remat policies to try (`spmd.plan.request.remat`); default all, least recomputation first.
        jobs: compiles at once, in worker processes; ``None``: as the cores and memory allow (`default_jobs`); 1: here.
        cache_dir: where compiles are cached; ``None`` turns caching off.
        log: receives the progress lines (default: stderr).
        refine: variants of the winner's policy one tensor away to search after the presets, at most
            (`spmd.plan.advisor.refine`: MaxText's ``custom`` choices); 0: none.
    Raises:
        PlanError, TopologyError, CompilerVersionError, ModelSpecError: bad input, with what to change.
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    choose = _check_choices(strategies, per_device_batches, remats, tensors, datas, jobs, contexts, refine)
    given = PlanSettings(topology, slices, seq_len, compute_dtype, attention, hbm_bytes, moment_dtype, vocab_tiles,
                         splash_blocks, scoped_vmem_kib, weight_dtype, fused)  # fmt: skip
    module, hf_config, settings = _model(model, given, "cp" in choose.strategies)
    meshes = _meshes(given.target, choose, hf_config)
    searches, dropped, shape = _searches(module, hf_config, meshes, settings, choose.batches, choose.policies, log)
    workers = _workers(model, jobs, searches, choose.batches, log)
    run = Settings(settings, cache_dir, model_key(model))
    source = module if isinstance(model, torch.nn.Module) else model
    interrupted = run_searches(source, searches, run, workers, log)
    outcomes = dropped + [o for s in searches for o in s.outcomes]
    if not interrupted:  # then the per-tensor variants of the winner's policy
        second = _second_pass(outcomes, searches, module, shape, settings, choose.batches, choose.refine)
        interrupted = _run_second_pass(second, outcomes, source, run, workers, log)
    return _advice(model, settings, module, hf_config, outcomes, choose, interrupted)
