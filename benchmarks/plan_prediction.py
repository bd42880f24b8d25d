"""The planner's predicted step against published training runs (issue 29, docs/plan.md "Calibration").

Plans every published run that has a recipe (`spmd.plan.predict.published.PUBLISHED`) with the recipe's
shape, through the planner's API, on this machine (libtpu compiles for the run's slice), and
prints a table: run, chips, published TFLOP/s per chip, predicted, error, and whether the run is
one the step-time model was fitted on (`spmd.plan.predict._calibration.CALIBRATION_RUNS`) or held out.

Each compile is cached in the planner's compile cache (``~/.cache/xla-spmd/plan``, or
``--cache``): the report as the advisor caches it, with the optimized HLO beside it
(``<entry>.hlo.gz``), so a rerun compiles nothing and can predict again with other constants.
For every run the step is predicted at a grid of matmul efficiencies; the script refits the
efficiency on the calibration runs (minimax, `fit_efficiency`) and reports it beside the shipped
constant. ``--record`` writes those per-run grids (tests/data/plan_calibration.json; a run not planned this
time keeps its recorded grid), from which
``tests/spmd/plan/test_calibration.py`` refits and checks the constant.

    python benchmarks/plan_prediction.py                          # every run; compiles what is not cached
    python benchmarks/plan_prediction.py --runs maxtext-16b@v5e-256
    python benchmarks/plan_prediction.py --cached-only --record tests/data/plan_calibration.json
    python benchmarks/plan_prediction.py --cached-only --host-gbs 32,48,64,inf   # other host links

``--host-gbs`` predicts each run again with its chip's host link (PCIe, each way) at each given
bandwidth, GB/s, ``inf`` for a free link, the shipped calibration otherwise: how much of a
run's error hangs on the one chip figure the offloading recipes wait on (docs/plan.md,
"Calibration").
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

from spmd.files import atomic_write
from spmd.plan.advisor.advice import Candidate
from spmd.plan.advisor.plan_cache import Settings, cached_outcome, default_cache_dir, entry_path, model_key, write_entry
from spmd.plan.api import plan_program
from spmd.plan.predict._calibration import (
    CALIBRATION,
    CALIBRATION_RUNS,
    SLICE_CALIBRATION_RUNS,
    CalibrationPoint,
    fit_efficiency,
    fit_efficiency_and_host_link,
    fit_slice_share,
)
from spmd.plan.predict._step_time import predict_step
from spmd.plan.predict.published import PUBLISHED, Published, published_run, run_name, slice_scaling
from spmd.plan.report.plan_report import GIB, PlanReport
from spmd.plan.request.settings import PlanSettings
from spmd.plan.request.topology import CHIP_SPECS, TpuSlice

# Efficiencies each run's step is predicted at (the fit interpolates between them).
GRID = tuple(round(0.50 + 0.02 * k, 2) for k in range(26))
# Host links, bytes/s each way, a generation's fitted link is chosen from (2 GB/s apart).
HOST_GRID = tuple(float(gbs * 1e9) for gbs in range(24, 74, 2))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _candidate(p: Published) -> tuple[Candidate, Settings]:
    r = p.recipe
    assert r is not None  # only runs with a recipe get here (`main`)
    settings = _settings(p)
    return Candidate(r.strategy, r.mesh, r.batch_per_shard, r.remat), Settings(settings, None, model_key(p.model))


def _settings(p: Published) -> PlanSettings:
    r = p.recipe
    assert r is not None  # only runs with a recipe get here (`main`)
    return PlanSettings(
        r.topology,
        slices=r.slices,
        seq_len=r.seq_len,
        attention=r.attention,
        moment_dtype=r.moment_dtype,
        vocab_tiles=r.vocab_tiles,
        splash_blocks=r.splash_blocks,
        scoped_vmem_kib=r.scoped_vmem_kib,
        weight_dtype=r.weight_dtype,
        fused=r.fused,
    )


def compiled_run(p: Published, cache_dir: Path, compile_missing: bool) -> tuple[PlanReport, str] | None:
    """``p``'s report and optimized HLO: from the cache, else compiled (and cached); ``None`` when
    not cached and ``compile_missing`` is false."""
    candidate, settings = _candidate(p)
    settings = dataclasses.replace(settings, cache_dir=cache_dir)
    path = entry_path(candidate, settings)
    assert path is not None  # built-in models are always cached
    hlo_path = path.with_name(path.stem + ".hlo.gz")
    cached = cached_outcome(candidate, settings, _log) if hlo_path.exists() else None
    if cached is not None and cached.report is not None:
        return cached.report, gzip.decompress(hlo_path.read_bytes()).decode()
    if not compile_missing:
        return None
    _log(f"{run_name(p)}: compiling {candidate.label()} for {p.recipe.topology} ...")  # type: ignore[union-attr]
    report, hlo = plan_program(
        p.model, settings.plan, strategy=candidate.strategy, mesh=candidate.mesh_shape,
        global_batch=candidate.global_batch, remat=candidate.remat,
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(hlo_path) as tmp:
        tmp.write_bytes(gzip.compress(hlo.encode(), compresslevel=6))
    write_entry(path, report, _log)
    _log(f"{run_name(p)}: compiled in {report.compile_seconds:.0f} s")
    return report, hlo


def calibration_point(p: Published, report: PlanReport, hlo: str, host_link: float | None = None) -> CalibrationPoint:
    """The run's predicted step at every `GRID` efficiency (matmuls and attention alike), with its
    chip's host link at ``host_link`` bytes/s each way (``None``: the shipped calibration's)."""
    target = _settings(p).target
    chip = target.chip.libtpu_name
    link = CALIBRATION.host_bytes_per_second(target.chip) if host_link is None else host_link
    seconds = []
    for e in GRID:
        calibration = dataclasses.replace(
            CALIBRATION, matmul_efficiency=e, attention_efficiency=e, chip_efficiency=(), chip_host_link=((chip, link),)
        )
        seconds.append(predict_step(hlo, target, calibration).seconds)
    flops = report.estimate.model_flops_per_step / report.chips
    return CalibrationPoint(run_name(p), p.planner_tflops(), flops, GRID, tuple(seconds), link)


def host_link_points(p: Published, report: PlanReport, hlo: str) -> list[CalibrationPoint]:
    """A calibration run of a generation whose host link is fitted (`Calibration.chip_host_link`):
    its grid at every `HOST_GRID` link; none for any other run."""
    fitted = dict(CALIBRATION.chip_host_link)
    if run_name(p) not in CALIBRATION_RUNS or _settings(p).target.chip.libtpu_name not in fitted:
        return []
    return [calibration_point(p, report, hlo, link) for link in HOST_GRID]


def host_link_errors(hlo: str, target: TpuSlice, point: CalibrationPoint, gbs: tuple[float, ...]) -> dict[str, float]:
    """(predicted - published) / published TFLOP/s a chip, the run's figures as ``point`` holds
    them, with ``target``'s host link at each of ``gbs`` GB/s, each way."""
    errors = {}
    for bandwidth in gbs:
        calibration = dataclasses.replace(CALIBRATION, chip_host_link=((target.chip.libtpu_name, bandwidth * 1e9),))
        seconds = predict_step(hlo, target, calibration).seconds
        errors[f"{bandwidth:g}"] = point.model_flops_per_chip / seconds / 1e12 / point.published_tflops - 1
    return errors


def _bandwidths(text: str) -> tuple[float, ...]:
    """``--host-gbs``: comma-separated GB/s, each positive (``inf``: a free link)."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not comma-separated numbers (GB/s; inf for a free link)"
        ) from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each bandwidth must be positive GB/s (inf for a free link)")
    return values


def run_row(p: Published, report: PlanReport, hlo: str, point: CalibrationPoint) -> dict[str, Any]:
    """One table row: the shipped calibration's prediction, and what the program is."""
    step = predict_step(hlo, _settings(p).target)
    predicted = report.estimate.model_flops_per_step / report.chips / step.seconds / 1e12
    return {
        "run": point.run, "source": p.source, "chip": p.chip, "chips": p.chips, "model": p.model,
        "recipe": dataclasses.asdict(p.recipe),  # type: ignore[arg-type]
        "role": _role(point.run),
        "published_tflops_per_chip": point.published_tflops, "published_mfu": p.mfu,
        "published_from_mfu": not p.tflops_per_chip, "published_counts_attention_whole": p.counts_attention_whole,
        "predicted_tflops_per_chip": predicted, "predicted_mfu": predicted * 1e12 / p.peak_flops,
        "error": predicted / point.published_tflops - 1,
        "predicted_seconds": step.seconds, "op_seconds": step.op_seconds, "exposed_seconds": step.exposed_seconds,
        "program_flops_over_model": step.hardware_flops * report.devices / report.estimate.model_flops_per_step,
        "hbm_gib_per_device": report.memory.total_bytes / GIB, "fits": report.fits,
        "compile_seconds": report.compile_seconds,
    }  # fmt: skip


def _role(run: str) -> str:
    """``calibration`` (the efficiency's fit), ``slice fit`` (only its published figure against its
    one slice's: the slice term's fit) or ``held-out``."""
    if run in CALIBRATION_RUNS:
        return "calibration"
    return "slice fit" if run in SLICE_CALIBRATION_RUNS else "held-out"


def slice_fit() -> dict[str, Any]:
    """The slice term refitted on the published figures of `SLICE_CALIBRATION_RUNS`, with each
    ratio's error, and the held-out runs' (the other runs on several slices)."""
    scalings = [s for p in PUBLISHED if (s := slice_scaling(p)) is not None]
    chosen = [s for s in scalings if s.run in SLICE_CALIBRATION_RUNS]
    share = fit_slice_share(chosen)
    return {
        "share": share,
        "errors": {s.run: s.error(share) for s in chosen},
        "held_out_errors": {s.run: s.error(share) for s in scalings if s.run not in SLICE_CALIBRATION_RUNS},
    }


def _fits(points: list[CalibrationPoint], linked: list[CalibrationPoint]) -> dict[str, Any]:
    """The minimax efficiency on the calibration runs, all together and per chip; for a chip whose
    host link is fitted (``linked`` holds its calibration runs at each `HOST_GRID` link), the
    efficiency and the link together, each run's errors at the pair."""
    chosen = [pt for pt in points if pt.run in CALIBRATION_RUNS]
    if not chosen:
        return {}
    by_chip: dict[str, list[CalibrationPoint]] = {}
    for pt in chosen:
        by_chip.setdefault(_chip_of(pt.run), []).append(pt)
    fitted = fit_efficiency(chosen)
    per_chip = {chip: fit_efficiency(pts) for chip, pts in by_chip.items()}
    per_chip_errors = {pt.run: pt.error(per_chip[_chip_of(pt.run)]) for pt in chosen}
    links: dict[str, float] = {}
    for chip in {_chip_of(pt.run) for pt in linked}:
        own = [pt for pt in linked if _chip_of(pt.run) == chip]
        per_chip[chip], links[chip] = fit_efficiency_and_host_link(own)
        at_link = [pt for pt in own if pt.host_bytes_per_second == links[chip]]
        per_chip_errors.update({pt.run: pt.error(per_chip[chip]) for pt in at_link})
    return {
        "runs": [pt.run for pt in chosen], "efficiency": fitted,
        "errors": {pt.run: pt.error(fitted) for pt in chosen},
        "per_chip": per_chip, "per_chip_host_link_gbs": {c: b / 1e9 for c, b in links.items()},
        "per_chip_errors": per_chip_errors,
    }  # fmt: skip


def _chip_of(run: str) -> str:
    return _settings(published_run(run)).target.chip.libtpu_name


def print_table(rows: list[dict[str, Any]], fits: dict[str, Any], slices: dict[str, Any]) -> None:
    own = ", ".join(f"{chip} {e}" for chip, e in CALIBRATION.chip_efficiency)
    borrowed = ", ".join(
        f"{chip} {twin}'s" for chip in CHIP_SPECS if (twin := CALIBRATION.fitted_generation(chip)) not in (None, chip)
    )
    links = ", ".join(f"{chip} {bandwidth / 1e9:g}" for chip, bandwidth in CALIBRATION.chip_host_link)
    print(
        f"shipped efficiency {CALIBRATION.matmul_efficiency} (matmul and attention){'; ' + own if own else ''}"
        f"{'; by matrix unit: ' + borrowed if borrowed else ''}{'; host link (GB/s each way) ' + links if links else ''}"
    )
    print(f"{'run':28s} {'chips':>5s} {'published':>9s} {'predicted':>9s} {'error':>7s}  {'role':11s} program/model")
    for r in rows:
        err = f"{r['error']:+.1%}"
        marks = ("*" if r["published_from_mfu"] else "") + ("+" if r["published_counts_attention_whole"] else "")
        pub = f"{r['published_tflops_per_chip']:.0f}{marks}"
        print(
            f"{r['run']:28s} {r['chips']:5d} {pub:>9s} {r['predicted_tflops_per_chip']:9.0f} {err:>7s}  "
            f"{r['role']:11s} {r['program_flops_over_model']:.2f}"
        )
    if fits:
        errors = ", ".join(f"{k} {v:+.1%}" for k, v in fits["errors"].items())
        print(f"refit on {len(fits['runs'])} calibration runs: efficiency {fits['efficiency']:.3f} ({errors})")
        links = fits["per_chip_host_link_gbs"]
        print("per chip: " + ", ".join(
            f"{k} {v:.3f}" + (f" with a {links[k]:g} GB/s host link" if k in links else "") for k, v in fits["per_chip"].items()
        ))  # fmt: skip
        print("  errors: " + ", ".join(f"{k} {v:+.1%}" for k, v in fits["per_chip_errors"].items()))
    worst = max(abs(e) for e in slices["errors"].values())
    held = ", ".join(f"{k} {v:+.1%}" for k, v in slices["held_out_errors"].items())
    print(
        f"slice term (shipped {CALIBRATION.slice_doubling_share}) refit on {len(slices['errors'])} published ratios "
        f"to one slice: {slices['share']:.3f} per doubling, largest ratio error {worst:.1%}; held out: {held}"
    )


def print_host_links(rows: list[dict[str, Any]], gbs: tuple[float, ...]) -> None:
    print("error with the chip's host link at (GB/s each way; inf: free):")
    print(f"{'run':28s} " + " ".join(f"{g:>7g}" for g in gbs))
    for r in rows:
        print(f"{r['run']:28s} " + " ".join(f"{e:>+7.1%}" for e in r["host_link_errors"].values()))


def _runs(names: str | None) -> list[Published]:
    runs = [p for p in PUBLISHED if p.recipe is not None]
    if names is None:
        return runs
    wanted = names.split(",")
    unknown = sorted(set(wanted) - {run_name(p) for p in runs})
    if unknown:
        raise SystemExit(f"unknown runs {unknown}; known: {[run_name(p) for p in runs]}")
    return [p for p in runs if run_name(p) in wanted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", help="comma-separated run names (default: every run with a recipe)")
    parser.add_argument("--cache", type=Path, default=default_cache_dir(), help="the planner's compile cache")
    parser.add_argument("--cached-only", action="store_true", help="compile nothing; skip runs not cached")
    parser.add_argument("--json", type=Path, default=Path("runs") / "plan_prediction.json")
    parser.add_argument(
        "--record",
        type=Path,
        help="write the calibration points (per-run grids) here, keeping the runs not planned now",
    )
    parser.add_argument(
        "--host-gbs",
        type=_bandwidths,
        default=(),
        help="also predict each run with its chip's host link at these GB/s, each way (32,48,inf)",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    rows, points, linked, missing, refused = _plan_runs(args)
    fits, slices = _fits(points, linked), slice_fit()
    print_table(rows, fits, slices)
    if args.host_gbs:
        print_host_links(rows, args.host_gbs)
    if any(r["published_from_mfu"] for r in rows):
        print("* the source gives MFU only: published TFLOP/s per chip = MFU x the chip's peak")
    if any(r["published_counts_attention_whole"] for r in rows):
        print("+ the source counts causal attention whole: its figure in the planner's count (halved), the same step")
    if missing:
        print(f"not compiled (not in the cache): {', '.join(missing)}")
    for name, gib in refused.items():
        print(f"{name}: libtpu refused the program, out of memory ({gib:.1f} GiB a device)")
    out = {
        "rows": rows, "fit": fits, "slice_fit": slices, "not_compiled": missing, "out_of_memory_gib": refused, "grid": GRID,
        "seconds": time.perf_counter() - start,
    }  # fmt: skip
    _write(args.json, out)
    if args.record:
        _write(args.record, _recorded(args.record, points, linked))


def _plan_runs(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[CalibrationPoint], list[CalibrationPoint], list[str], dict[str, float]]:  # fmt: skip
    """Every run asked for, planned (or read from the cache): its table row, its calibration
    point, its points at other host links (`host_link_points`); the runs not compiled, and those
    libtpu refused (GiB a device)."""
    rows, points, linked, missing, refused = [], [], [], [], {}
    for p in _runs(args.runs):
        found = compiled_run(p, args.cache, not args.cached_only)
        if found is None:
            missing.append(run_name(p))
            continue
        if not found[1]:  # the compiler refused it (out of memory): no program to predict
            refused[run_name(p)] = found[0].memory.total_bytes / GIB
            continue
        point = calibration_point(p, *found)
        points.append(point)
        linked.extend(host_link_points(p, *found))
        rows.append(run_row(p, *found, point))
        if args.host_gbs:
            rows[-1]["host_link_errors"] = host_link_errors(found[1], _settings(p).target, point, args.host_gbs)
    return rows, points, linked, missing, refused


def _recorded(path: Path, points: list[CalibrationPoint], linked: list[CalibrationPoint]) -> dict[str, Any]:
    """The record with ``points`` and the calibration runs' points at other host links
    (``linked``): each run planned now replaces what was recorded of it; a run not planned now (not
    cached, or left out by ``--runs``) keeps what was recorded before, in order."""
    kept: dict[str, list[dict[str, Any]]] = {"points": [], "host_link_points": []}
    if path.exists():
        try:
            data = json.loads(path.read_text())
            kept = {key: [k for k in data.get(key, []) if isinstance(k, dict) and "run" in k] for key in kept}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SystemExit(
                f"--record {path}: not a calibration record ({type(e).__name__}: {e}); move it aside"
            ) from None
    planned = {p.run for p in points}
    fresh = {p.run: dataclasses.asdict(p) for p in points}
    merged = [fresh.pop(k["run"], k) for k in kept["points"]]
    old_links = [k for k in kept["host_link_points"] if k["run"] not in planned]
    return {
        "calibration_runs": list(CALIBRATION_RUNS),
        "points": merged + list(fresh.values()),
        "host_link_points": old_links + [dataclasses.asdict(p) for p in linked],
    }


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
