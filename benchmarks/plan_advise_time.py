"""How long the README's advise line takes, cold (a fresh compile cache) and warm (the same cache
again), in wall and CPU seconds, with how many plans it compiled, read from the cache and ruled
out unseen, and the winner it found.

Wall time on a shared machine depends on what else runs, so CPU time (user + system of the
advisor and its worker processes, from ``getrusage(RUSAGE_CHILDREN)``) is given beside it, and
the load average before and after each run.

    python benchmarks/plan_advise_time.py [--jobs N] [--warm-only --cache DIR]
        [--json runs/plan_advise_time.json] [-- <advisor flags replacing the README line's>]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spmd.files import atomic_write, file_to_write  # noqa: E402

# The README's line (docs/plan.md, issue 29): llama3.1-70b on 64 TPU7x chips, 8k, flash.
README_LINE = (
    "llama3.1-70b --topology tpu7x-128 --seq 8192 --attention flash --advise --strategies fsdp,2d --tensors 4"
).split()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _counts(advice: dict[str, Any]) -> dict[str, Any]:
    """Plans compiled, read from the cache, and ruled out unseen; the winner and its prediction."""
    outcomes = advice["outcomes"]
    reports = [o for o in outcomes if o["report"] is not None]
    winner = next((o for o in outcomes if o["report"] is not None and o["report"]["fits"]), None)
    return {
        "compiled": sum(not o["cached"] for o in reports),
        "cached": sum(o["cached"] for o in reports),
        "skipped": sum(o["report"] is None for o in outcomes),
        "winner": advice["winner"],
        "winner_predicted_mfu": None if winner is None else winner["report"]["estimate"]["predicted_mfu"],
    }


def run_once(line: list[str], cache: Path, jobs: int | None, out: Path) -> dict[str, Any]:
    """One advise run in a child process: wall and CPU seconds, the load average, the counts."""
    cmd = [sys.executable, "-m", "spmd.plan", *line, "--cache", str(cache), "--json", str(out)]
    cmd += [] if jobs is None else ["--jobs", str(jobs)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    load_before, cpu, wall = os.getloadavg(), _children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - wall, _children_cpu() - cpu
    if done.returncode not in (0, 1):  # 1: nothing fits, still an answer
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the advisor failed (exit {done.returncode}): {' '.join(cmd)}")
    advice = json.loads(out.read_text())
    return {
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        **_counts(advice),
        "progress": [ln for ln in done.stderr.splitlines() if ln.startswith(("  ", "[advisor", "advisor"))],
    }


def table(runs: dict[str, dict[str, Any]]) -> str:
    head = (
        f"{'run':5s} {'compiled':>8s} {'cached':>6s} {'skipped':>7s} {'CPU s':>8s} {'wall s':>8s} {'load':>11s}  winner"
    )
    rows = [head]
    for name, r in runs.items():
        load = f"{r['load_before'][0]:.1f}->{r['load_after'][0]:.1f}"
        mfu = "" if r["winner_predicted_mfu"] is None else f" (predicted MFU {100 * r['winner_predicted_mfu']:.1f} %)"
        rows.append(
            f"{name:5s} {r['compiled']:8d} {r['cached']:6d} {r['skipped']:7d} {r['cpu_seconds']:8.1f} "
            f"{r['wall_seconds']:8.1f} {load:>11s}  {r['winner']}{mfu}"
        )
    return "\n".join(rows)


def main() -> None:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=at_least(1), default=None, help="the advisor's --jobs (default: its own)")
    p.add_argument("--cache", type=Path, default=None, help="with --warm-only: the cache directory of an earlier run")
    p.add_argument("--warm-only", action="store_true", help="one run on --cache as it is (no cold run)")
    p.add_argument("--json", type=Path, default=ROOT / "runs" / "plan_advise_time.json")
    p.add_argument("line", nargs="*", help="advisor flags replacing the README line's")
    args = p.parse_args()
    if args.warm_only != (args.cache is not None):
        p.error("--warm-only and --cache go together: a warm run on the cache of an earlier (cold) run")
    if args.cache is not None and not args.cache.is_dir():
        p.error(f"--cache {args.cache} is not a directory: give the cache directory of an earlier run")
    if args.jobs is not None and not 1 <= args.jobs <= 64:
        p.error(f"--jobs must be from 1 to 64, got {args.jobs}")
    try:
        out = file_to_write(args.json, "--json")
    except (TypeError, ValueError) as e:
        p.error(str(e))
    line = args.line or README_LINE
    with tempfile.TemporaryDirectory(prefix="plan-advise-time-") as tmp:
        cache = args.cache or Path(tmp) / "cache"
        names = ["warm"] if args.warm_only else ["cold", "warm"]
        runs = {n: run_once(line, cache, args.jobs, Path(tmp) / f"{n}.json") for n in names}
    print(f"python -m spmd.plan {' '.join(line)}" + ("" if args.jobs is None else f" --jobs {args.jobs}"))
    print(table(runs))
    with atomic_write(out) as f:
        f.write_text(json.dumps({"line": line, "jobs": args.jobs, "cpus": os.cpu_count(), "runs": runs}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
