"""`advise`: search sharding plans, remat policies and batches for a model on a TPU topology by
compiling them with the TPU compiler; rank those that fit; write the winner as code.

Candidates are (strategy, mesh) x remat policy x per-device batch:
- ``fsdp``: ``fsdp`` over each slice's devices (``data`` over slices), and ``data`` x ``fsdp``
  for each ``--datas`` size (HSDP: parameters sharded within each ``fsdp`` group);
- ``2d``: ``fsdp`` x ``tensor`` for each ``tensor`` size that divides a slice's devices and the
  model's attention heads;
- ``dp``: one ``data`` axis over every device;
- remat policies in order of recomputation, ``none``, ``dots``, ``full``, ``offload``
  (`spmd.plan.remat`).

Not every candidate is compiled (MaxText's ``estimator.py`` searches the same way, by
ahead-of-time out-of-memory checks). A mesh whose parameters and AdamW state alone exceed the
budget is dropped unseen. On each mesh, a policy's batches run smallest first until one does not
fit; the next policy (more recomputation, less memory) starts at that batch, since at a batch
the previous policy fits it would only be slower. So each policy's largest fitting batch is
found with at most one compile per batch and policy. Compiles are cached on disk by everything
that determines them (`spmd.plan.plan_cache`), so a second ``--advise`` is instant.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spmd.plan.advice import Advice, Candidate, Outcome
from spmd.plan.attention import Attention, splash_block
from spmd.plan.errors import PlanError
from spmd.plan.lowering import find_layer_stack
from spmd.plan.meshes import STRATEGIES, build_mesh, tpu_devices
from spmd.plan.models import build_meta_model, resolve_seq_len
from spmd.plan.plan_cache import Settings, default_cache_dir, model_key, run_candidate
from spmd.plan.remat import Remat
from spmd.plan.report import GIB
from spmd.plan.specs import param_spec_for, state_bytes, uneven_splits
from spmd.plan.topology import TpuSlice, parse_slice

__all__ = ["Advice", "Candidate", "Outcome", "advise", "candidates_for", "default_cache_dir"]

Log = Callable[[str], None]


def candidates_for(
    target: TpuSlice,
    strategies: Sequence[str],
    tensors: Sequence[int],
    heads: int | None,
    datas: Sequence[int] = (1,),
) -> list[tuple[str, dict[str, int]]]:
    """The (strategy, mesh) pairs the advisor tries on ``target`` (module docstring); ``datas``:
    sizes of a ``data`` axis inside each slice for ``fsdp`` (``data`` x ``fsdp``, HSDP: the
    parameters sharded over ``fsdp`` only, the batch over both)."""
    per_slice = target.devices_per_slice
    data = {"data": target.slices} if target.slices > 1 else {}
    out: list[tuple[str, dict[str, int]]] = []
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise PlanError(f"Unknown strategy {strategy!r}; known: {STRATEGIES}.")
        if strategy == "fsdp":
            for d in sorted(set(datas)):
                if 0 < d < per_slice and per_slice % d == 0:
                    inner = {"data": target.slices * d} if target.slices * d > 1 else {}
                    out.append(("fsdp", {**inner, "fsdp": per_slice // d}))
        elif strategy == "dp":
            out.append(("dp", {"data": target.devices}))
        else:
            for t in tensors:
                if 1 < t < per_slice and per_slice % t == 0 and (heads is None or heads % t == 0):
                    out.append(("2d", {**data, "fsdp": per_slice // t, "tensor": t}))
    return out


@dataclass(frozen=True)
class _Search:
    """One mesh's search: its candidates' strategy and mesh, the batches and policies to walk."""

    strategy: str
    mesh: tuple[tuple[str, int], ...]
    batches: tuple[int, ...]
    remats: tuple[str, ...]


def _walk(model: Any, search: _Search, settings: Settings, log: Log) -> list[Outcome]:
    """Compile one mesh's candidates in the order of the module docstring."""
    outcomes: list[Outcome] = []
    start = 0
    for remat in search.remats:
        index = start
        while index < len(search.batches):
            c = Candidate(search.strategy, search.mesh, search.batches[index], remat)
            outcome = run_candidate(model, c, settings, log)
            outcomes.append(outcome)
            if not outcome.fits:
                break
            index += 1
        if index == len(search.batches):
            break  # this policy fits every batch: more recomputation would only be slower
        start = index
    return outcomes


def _walk_in_worker(args: tuple[Any, ...]) -> list[Outcome]:
    return _walk(*args, log=lambda line: print(line, file=sys.stderr, flush=True))


def _run(model: Any, searches: list[_Search], settings: Settings, jobs: int, log: Log) -> list[Outcome]:
    """Every mesh's walk, ``jobs`` at a time in spawned processes (a forked child of a process
    with libtpu loaded aborts), or here."""
    outcomes: list[Outcome] = []
    if jobs > 1 and len(searches) > 1 and not isinstance(model, torch.nn.Module):
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(searches)), mp_context=spawn) as pool:
            futures = [pool.submit(_walk_in_worker, (model, s, settings)) for s in searches]
            for k, fut in enumerate(futures, 1):
                outcomes += fut.result()
                log(f"[{k}/{len(searches)} meshes done]")
        return outcomes
    for k, search in enumerate(searches, 1):
        outcomes += _walk(model, search, settings, log)
        log(f"[{k}/{len(searches)} meshes done]")
    return outcomes


def _searches(
    target: TpuSlice, module: torch.nn.Module, hf_config: Any, meshes: list[tuple[str, dict[str, int]]],
    batches: tuple[int, ...], remats: tuple[str, ...], budget: int, log: Log,
) -> tuple[list[_Search], list[Outcome]]:  # fmt: skip
    """The meshes worth compiling, and an `Outcome` for each one dropped unseen (module docstring)."""
    devices = tpu_devices(target)
    params = {n: tuple(p.shape) for n, p in module.named_parameters()}
    searches, dropped = [], []
    for strategy, shape in meshes:
        items = tuple(shape.items())
        our_mesh = build_mesh(shape, target, devices)
        spec_fn = param_spec_for(strategy, our_mesh, hf_config)
        uneven = uneven_splits(params, spec_fn, our_mesh)
        state = state_bytes(params, spec_fn, our_mesh)
        why = ""
        if uneven:
            listed = "; ".join(uneven[:2]) + (f"; {len(uneven) - 2} more" if len(uneven) > 2 else "")
            why = f"not compiled: unequal blocks ({listed}); JAX needs even splits"
        elif state > budget:
            why = (
                f"not compiled: parameters + AdamW state alone take {state / GIB:.2f} GiB/device (our sharding "
                f"math) > {budget / GIB:.2f} GiB"
            )
        if why:
            dropped.append(Outcome(Candidate(strategy, items, batches[0], remats[0]), skipped=why))
            log(f"  {strategy} {dict(shape)}: {why}")
        else:
            searches.append(_Search(strategy, items, batches, remats))
    log(f"advisor: {len(searches)} meshes to compile; per-device batches {list(batches)}, remat {list(remats)}")
    return searches, dropped


@dataclass(frozen=True)
class _Choices:
    """What the advisor tries, checked: strategies, batches, remat policies, tensor and data sizes."""

    strategies: tuple[str, ...]
    batches: tuple[int, ...]
    policies: tuple[str, ...]
    tensors: tuple[int, ...]
    datas: tuple[int, ...]


def _names(values: Iterable[Any] | str) -> list[Any]:
    """A list of names; one string may hold several, comma-separated (``"fsdp,2d"``)."""
    return [v.strip() for v in values.split(",")] if isinstance(values, str) else list(values)


def _sizes(name: str, values: Iterable[int]) -> tuple[int, ...]:
    given = list(values)
    if not given or any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 2**31 for v in given):
        raise PlanError(f"{name} must be positive integers, got {given!r:.200}.")
    return tuple(sorted(set(given)))


def _check_choices(
    strategies: Sequence[str] | str,
    per_device_batches: Iterable[int],
    remats: Iterable[str | Remat] | str,
    tensors: Iterable[int],
    datas: Iterable[int],
    compute_dtype: str,
    hbm_bytes: int | None,
    jobs: int,
) -> _Choices:
    """The choices to try, checked with the settings before any compile."""
    _check_settings(compute_dtype, hbm_bytes, jobs)
    policies = sorted({Remat.parse(r) for r in _names(remats)}, key=list(Remat).index)
    if not policies:
        raise PlanError(f"remats must name at least one policy of {[r.value for r in Remat]}.")
    return _Choices(
        tuple(_names(strategies)),
        _sizes("per_device_batches", per_device_batches),
        tuple(p.value for p in policies),
        _sizes("tensors", tensors),
        _sizes("datas", datas),
    )


def _check_settings(compute_dtype: str, hbm_bytes: int | None, jobs: int) -> None:
    """What ``plan`` would refuse for every candidate, refused once, before any compile."""
    if compute_dtype not in ("bfloat16", "float32"):
        raise PlanError(f"compute_dtype must be 'bfloat16' or 'float32', got {compute_dtype!r:.60}.")
    if hbm_bytes is not None and (isinstance(hbm_bytes, bool) or not isinstance(hbm_bytes, int) or hbm_bytes < 1):
        raise PlanError(f"hbm_bytes must be a positive int (bytes per device) or None, got {hbm_bytes!r:.60}.")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= 64:
        raise PlanError(f"jobs must be a whole number from 1 to 64 (meshes compiled at once), got {jobs!r:.60}.")


def _no_mesh_error(target: TpuSlice, strategies: Sequence[str], tensors: Iterable[int], heads: int | None) -> PlanError:
    per_slice = target.devices_per_slice
    return PlanError(
        f"No candidate to compile: strategies {list(strategies)} with tensor sizes {list(tensors)} give no mesh "
        f"on {target.name} (a 2-D tensor size must be between 2 and {per_slice - 1}, divide the "
        f"{per_slice} devices of a slice"
        + (f" and the model's {heads} attention heads)" if heads else ")")
        + ". Add 'fsdp' or 'dp' to the strategies, or give other tensor sizes."
    )


def _model(model: Any, seq_len: int | None, kernel: Attention) -> tuple[torch.nn.Module, Any, int]:
    """The model on ``meta``, its config, and the sequence length (checked for the kernel)."""
    module, hf_config = build_meta_model(model)
    seq = resolve_seq_len(seq_len, hf_config)
    if kernel is Attention.FLASH:
        splash_block(seq)
    return module, hf_config, seq


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


def _notes(outcomes: list[Outcome], remats: tuple[str, ...], strategies: Sequence[str]) -> tuple[str, ...]:
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
    strategies: Sequence[str] = STRATEGIES,
    per_device_batches: Iterable[int] = (1, 2, 4),
    tensors: Iterable[int] = (2, 4, 8),
    datas: Iterable[int] = (1,),
    remats: Iterable[str | Remat] = ("none", "dots", "full", "offload"),
    attention: str | Attention = "dot",
    seq_len: int | None = None,
    compute_dtype: str = "bfloat16",
    hbm_bytes: int | None = None,
    jobs: int = 1,
    cache_dir: Path | str | None = None,
    log: Log | None = None,
) -> Advice:
    """Search the candidate plans (module docstring) and rank them.

    Args:
        model: as in `spmd.plan.plan`.
        topology: as in `spmd.plan.plan`.
        slices: as in `spmd.plan.plan`.
        seq_len: as in `spmd.plan.plan`.
        compute_dtype: as in `spmd.plan.plan`.
        attention: as in `spmd.plan.plan`; every candidate runs it.
        strategies: which of ``fsdp``, ``2d``, ``dp`` to try.
        per_device_batches: sequences per batch shard to try.
        tensors: ``tensor`` axis sizes for 2-D.
        datas: ``data`` axis sizes within a slice for ``fsdp`` (``data`` x ``fsdp``); 1: none.
        remats: remat policies to try (`spmd.plan.remat`).
        hbm_bytes: the per-device memory budget; default the device's HBM.
        jobs: meshes compiled at once in spawned processes (docs/plan.md); 1 compiles here.
        cache_dir: where compiles are cached; ``None`` turns caching off.
        log: receives one progress line per compile (default: stderr).

    Raises:
        PlanError, TopologyError, CompilerVersionError, ModelSpecError: bad input, with what to change.
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    choose = _check_choices(strategies, per_device_batches, remats, tensors, datas, compute_dtype, hbm_bytes, jobs)
    target = parse_slice(topology, slices)
    budget = target.chip.device_hbm_bytes if hbm_bytes is None else hbm_bytes
    kernel = Attention.parse(attention)
    module, hf_config, seq_len = _model(model, seq_len, kernel)
    heads = getattr(hf_config, "num_attention_heads", None) or getattr(hf_config, "n_head", None)
    meshes = candidates_for(target, choose.strategies, choose.tensors, heads, choose.datas)
    if not meshes:
        raise _no_mesh_error(target, choose.strategies, choose.tensors, heads)
    searches, dropped = _searches(target, module, hf_config, meshes, choose.batches, choose.policies, budget, log)
    settings = Settings(topology, slices, seq_len, compute_dtype, kernel.value, budget, cache_dir, model_key(model))
    outcomes = dropped + _run(module if isinstance(model, torch.nn.Module) else model, searches, settings, jobs, log)
    name = str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__
    notes = _notes(outcomes, choose.policies, choose.strategies)
    return Advice(  # fields in order: model, topology, chip, chips, slices, seq, dtype, attention, budget, ...
        name, target.name, target.chip.name, target.chips, target.slices, seq_len, compute_dtype, kernel.value,
        budget, _rank(outcomes), _block_class(module), getattr(hf_config, "model_type", None), notes,
    )  # fmt: skip
