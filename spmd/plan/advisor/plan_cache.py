"""The advisor's compile of one candidate, cached on disk by everything that determines it: the
model (a built-in's config, a config file's bytes), the topology, the plan's arguments and the
versions of the packages that compile it. Factories and modules are never cached: their code can
change under the same name."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spmd._util.atomic_file import atomic_write
from spmd._util.regular_file import read_regular_file
from spmd.plan.advisor.advice import Candidate, Outcome
from spmd.plan.errors import PlanError
from spmd.plan.report.plan_report import GIB, PlanReport
from spmd.plan.request.models import BUILTIN_CONFIGS
from spmd.plan.request.settings import PlanSettings

__all__ = ["CACHE_FORMAT", "Settings", "cached_outcome", "compile_candidate", "default_cache_dir", "entry_path",
           "model_key", "run_candidate", "write_entry"]  # fmt: skip

_MAX_ENTRY_BYTES = 64 * 2**20  # an entry is a few KiB of JSON
# Bump when PlanReport's JSON or the compiled program changes (2: remat, attention, devices,
# toolchain; 3: device order; 4: remat by MaxText's names, the first moment's dtype; 5: the
# predicted step; 6: the predicted step across slices, the slices' waits; 7: splash block sizes, a
# windowed kernel costed by its blocks, a forward kernel named with its block sizes costed as one).
CACHE_FORMAT = 7


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/xla-spmd/plan`` (``~/.cache/...``)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "xla-spmd" / "plan"


@dataclass(frozen=True)
class Settings:
    """What every candidate of one advice shares (picklable, for the advisor's worker processes):
    the plan settings (`PlanSettings`, the sequence length resolved), where to cache, and what
    identifies the model there (``None``: not cached)."""

    plan: PlanSettings
    cache_dir: Path | str | None
    model_key: str | None


def model_key(model: Any) -> str | None:
    """What identifies the model for the compile cache (``None``: do not cache)."""
    if isinstance(model, str) and model in BUILTIN_CONFIGS:
        return f"builtin:{model}:{json.dumps(BUILTIN_CONFIGS[model], sort_keys=True)}"
    if isinstance(model, (str, Path)) and Path(model).is_file():
        return "file:" + hashlib.sha256(Path(model).read_bytes()).hexdigest()
    return None


def _versions() -> str:
    found = []
    for dist in ("jax", "jaxlib", "libtpu", "torchax", "torch", "transformers", "xla-spmd"):
        try:
            found.append(f"{dist}={md.version(dist)}")
        except md.PackageNotFoundError:
            found.append(f"{dist}=?")
    return ",".join(found)


def _plan_kwargs(c: Candidate) -> dict[str, Any]:
    return dict(strategy=c.strategy, mesh=c.mesh_shape, global_batch=c.global_batch, remat=c.remat)


def entry_path(c: Candidate, s: Settings) -> Path | None:
    """Where ``c``'s report is cached (``None``: caching off, or a model that is never cached)."""
    if s.cache_dir is None or s.model_key is None:
        return None
    what = {**s.plan.cache_key(), **_plan_kwargs(c)}
    key = json.dumps([CACHE_FORMAT, s.model_key, what, _versions()], sort_keys=True)
    return Path(s.cache_dir) / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def _read_cached(path: Path, s: Settings, log: Callable[[str], None]) -> PlanReport | None:
    """The report cached at ``path``, or ``None`` (then compiled afresh) if the entry is missing
    or damaged: a cache is never a reason to fail the advice."""
    if not path.exists():
        return None
    try:
        text = read_regular_file(path, limit=_MAX_ENTRY_BYTES, what="the plan cache entry", error=PlanError)
        return PlanReport.from_dict(json.loads(text)).with_hbm(s.plan.budget)
    except (PlanError, ValueError, KeyError, TypeError, AttributeError) as e:
        log(f"  the cache entry {path} is damaged ({type(e).__name__}: {str(e)[:120]}); compiling afresh")
        return None


def write_entry(path: Path, report: PlanReport, log: Callable[[str], None]) -> None:
    """Cache ``report`` at ``path`` (atomically); a failed write is logged, never raised."""
    try:
        with atomic_write(path) as tmp:
            tmp.write_text(json.dumps(report.to_dict()))
    except OSError as e:  # a directory in the way, a full disk: the advice stands, uncached
        log(f"  cannot write the cache entry {path} ({e.strerror}); not cached")


def cached_outcome(c: Candidate, s: Settings, log: Callable[[str], None]) -> Outcome | None:
    """``c``'s outcome from the cache, or ``None`` (not cached, caching off, or a damaged entry)."""
    path = entry_path(c, s)
    cached = _read_cached(path, s, log) if path is not None else None
    if cached is None:
        return None
    log(f"  {c.strategy} {c.label()}: {cached.memory.total_bytes / GIB:.2f} GiB/device, {_verdict(cached)}, cached")
    return Outcome(c, cached, cached=True)


def compile_candidate(model: Any, c: Candidate, s: Settings, log: Callable[[str], None]) -> Outcome:
    """``c`` compiled (and cached); a `PlanError` is an outcome that says why it was not compiled."""
    from spmd.plan.api import plan_with

    wall, cpu = time.perf_counter(), time.process_time()  # CPU too: wall time is shared with other work
    try:
        report = plan_with(model, s.plan, **_plan_kwargs(c))
    except PlanError as e:
        log(f"  {c.strategy} {c.label()}: not compiled: {e}")
        return Outcome(c, skipped=f"not compiled: {e}")
    path = entry_path(c, s)
    if path is not None:
        write_entry(path, report, log)
    log(
        f"  {c.strategy} {c.label()}: {report.memory.total_bytes / GIB:.2f} GiB/device, {_verdict(report)}, "
        f"compiled in {report.compile_seconds:.0f} s (planned in {time.perf_counter() - wall:.0f} s wall, "
        f"{time.process_time() - cpu:.0f} s CPU)"
    )
    return Outcome(c, report)


def run_candidate(model: Any, c: Candidate, s: Settings, log: Callable[[str], None]) -> Outcome:
    """``c``'s outcome, from the cache or compiled (and cached)."""
    return cached_outcome(c, s, log) or compile_candidate(model, c, s, log)


def _verdict(report: PlanReport) -> str:
    return "fits" if report.fits else "OOM"
