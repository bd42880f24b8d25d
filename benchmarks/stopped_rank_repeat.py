"""Repeat the stopped-rank and killed-mid-collective tests under load: how often they pass, and
how long each surviving rank took from the fault to its report.

Runs ``pytest tests/test_multiprocess.py -k ...`` (the fault launch of 4 gloo ranks under
``torchrun --max-restarts 3``: rank 3 SIGSTOPped at step 13 of attempt 1, rank 2 SIGKILLed in
step 14's first collective of attempt 2) ``--runs`` times beside ``--busy`` processes spinning
on the CPU, then reads every rank's record of those two attempts: the error it ended with
(``CollectiveTimeoutError`` or ``PeerLostError``) and its time from the fault to the report. The
test failed in CI this way before: under load, a rank that read a closed connection exited with
gloo's raw error and torchrun's SIGTERM ended the ranks still diagnosing.

    python benchmarks/stopped_rank_repeat.py [--runs 20] [--busy 4] [--json runs/stopped_rank_repeat.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = {
    "stop": "test_a_stopped_rank_ends_the_others_with_a_clear_error_within_the_timeout",
    "killmid": "test_a_rank_killed_mid_collective_is_named_by_every_surviving_rank",
}
# (attempt, the faulty rank, its record's time of the fault, the surviving ranks)
FAULTS = {"stop": (1, 3, "stopped_at", (0, 1, 2)), "killmid": (2, 2, "killed_at", (0, 1, 3))}


def ranks_report(faults_dir: Path) -> dict[str, dict[int, dict]]:
    """For each fault, each surviving rank's error type and seconds from the fault to it."""
    out: dict[str, dict[int, dict]] = {}
    for fault, (attempt, faulty, key, survivors) in FAULTS.items():
        path = faults_dir / f"attempt{attempt}-rank{faulty}.json"
        if not path.exists():
            continue
        at = json.loads(path.read_text()).get(key)
        out[fault] = {}
        for rank in survivors:
            path = faults_dir / f"attempt{attempt}-rank{rank}.json"
            record = json.loads(path.read_text()) if path.exists() else {"end": "no record"}
            seconds = record["failed_at"] - at if at and "failed_at" in record else None
            out[fault][rank] = {"error": record["end"].split(":")[0], "seconds": seconds}
    return out


def one_run(index: int, workdir: Path) -> dict:
    base = workdir / f"run{index}"
    shutil.rmtree(base, ignore_errors=True)
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "tests/test_multiprocess.py", "--basetemp", str(base)]
    command += ["-k", " or ".join(TESTS.values())]
    load = os.getloadavg()[0]
    started = time.time()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    result = {"run": index, "passed": done.returncode == 0, "seconds": round(time.time() - started, 1)}
    result["tests"] = {
        fault: f"PASSED tests/test_multiprocess.py::{name}" in done.stdout for fault, name in TESTS.items()
    }
    result.update(load_before=round(load, 1), ranks=ranks_report(base / "faults0"))
    if done.returncode != 0:
        result["output"] = done.stdout[-3000:]
    return result


def summary(runs: list[dict]) -> dict:
    out = {"passed": sum(r["passed"] for r in runs), "runs": len(runs)}
    out.update({f"{fault} test passed": sum(r["tests"][fault] for r in runs) for fault in TESTS})
    for fault, (_, _, _, survivors) in FAULTS.items():
        for rank in survivors:
            times = [r["ranks"][fault][rank]["seconds"] for r in runs if fault in r["ranks"]]
            times = [t for t in times if t is not None]
            errors = [r["ranks"][fault][rank]["error"] for r in runs if fault in r["ranks"]]
            out[f"{fault} rank {rank}"] = {
                "seconds min/median/max": [round(f(times), 2) for f in (min, statistics.median, max)]
                if times
                else None,
                "errors": {e: errors.count(e) for e in sorted(set(errors))},
            }
    return out


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least, output_file

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=at_least(1), default=20)
    parser.add_argument("--busy", type=at_least(0), default=4, help="processes spinning on the CPU beside the tests")
    parser.add_argument("--workdir", type=Path, default=Path("runs") / "stopped_rank_repeat")
    parser.add_argument("--json", type=output_file, default=Path("runs") / "stopped_rank_repeat.json")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)  # pytest makes --basetemp itself, not its parents
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    runs: list[dict] = []
    try:
        for i in range(args.runs):
            runs.append(one_run(i, args.workdir.resolve()))
            r = runs[-1]
            told = {
                f: {k: (v["error"][:4], v["seconds"] and round(v["seconds"], 1)) for k, v in x.items()}
                for f, x in r["ranks"].items()
            }
            tests = ", ".join(f"{fault} {'pass' if ok else 'FAIL'}" for fault, ok in r["tests"].items())
            print(f"run {i}: {tests}, {r['seconds']} s, load {r['load_before']}: {told}", flush=True)
    finally:
        for process in busy:  # only the ones this script started
            process.kill()
            process.wait()
    result = {"config": {"runs": args.runs, "busy": args.busy, "cpus": os.cpu_count()}, "summary": summary(runs)}
    result["runs"] = runs
    print(json.dumps(result["summary"], indent=1))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
