"""Kill ranks of a 4-process FSDP run at random moments and print what the run lost (nothing).

Runs examples/train_fsdp.py on the dtensor backend twice under torchrun (4 CPU ranks, gloo):
once uninterrupted, once with ``--max-restarts`` while this script SIGKILLs a random rank at a
random moment of each attempt (mid-step or mid-save: saves come every ``--save-every`` steps),
plus one deterministic kill inside a save (after the rank wrote its shard file, before the
commit) and, with ``--stops``, SIGSTOPs (a hung rank: the others end with a
CollectiveTimeoutError after ``--timeout`` s, torchrun kills it 30 s later). Every attempt
resumes from the newest complete checkpoint.

What "lost" means, per step of the run: a loss that differs from the uninterrupted run's (rel
1e-4), a step that was never completed, or a data position (epoch, batch) that differs. The
work redone (steps run again after a restart) is reported too: it is the price of a restart,
bounded by ``--save-every``.

    python benchmarks/kill_ranks.py [--kills 6] [--steps 60] [--save-every 3] [--json runs/kill_ranks.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "train_fsdp_fault_worker.py"
NPROC = 4


def launch(out: Path, plan: str, train: list[str], restarts: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM"))}
    env.update(PYTHONPATH=str(ROOT), USE_TORCH_XLA="0")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(NPROC)]
    command += ["--max-restarts", str(restarts), str(WORKER), str(out), plan, *train]
    log = open(out / "torchrun.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(command, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT)


def records(out: Path) -> dict[tuple[int, int], dict]:
    found = {}
    for path in out.glob("attempt*-rank*.json"):
        try:
            r = json.loads(path.read_text())
        except json.JSONDecodeError:  # written while read
            continue
        found[(r["attempt"], r["rank"])] = r
    return found


class Killer(threading.Thread):
    """Each attempt: wait until rank 0 trains, then until it reaches a random step up to ``span``
    steps later, wait a random ``0..jitter`` s more (mid-step or mid-save), signal a random rank."""

    def __init__(self, out: Path, kills: int, stops: int, span: int, jitter: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.out, self.span, self.jitter, self.random = out, span, jitter, random.Random(seed)
        self.actions = ["kill"] * kills + ["stop"] * stops
        self.random.shuffle(self.actions)
        self.events: list[dict] = []
        self.done = threading.Event()

    def _pids(self, attempt: int) -> dict[int, int] | None:
        files = [self.out / f"pid-a{attempt}-rank{r}" for r in range(NPROC)]
        if not all(f.exists() for f in files):
            return None
        return {r: int(f.read_text()) for r, f in enumerate(files)}

    def run(self) -> None:
        attempt = 1  # attempt 0 carries the deterministic kill inside a save
        for action in self.actions:
            first = self._wait_for_training(attempt)
            if first is None:
                return
            target = first + self.random.randint(1, self.span)  # a random step of this attempt ...
            while not self.done.is_set() and self._step(0, attempt) < target:
                time.sleep(0.02)
            time.sleep(self.random.uniform(0, self.jitter))  # ... and a random moment in it (or its save)
            rank = self.random.randrange(NPROC)
            phase = self._phase(rank, attempt) or "starting"
            try:
                os.kill(self._pids(attempt)[rank], signal.SIGKILL if action == "kill" else signal.SIGSTOP)
            except ProcessLookupError:
                phase = "already gone"
            self.events.append(
                {"attempt": attempt, "action": action, "rank": rank, "phase": phase, "time": time.time()}
            )
            attempt += 1

    def _wait_for_training(self, attempt: int) -> int | None:
        """The first step attempt ``attempt`` runs, once rank 0 runs it (None: the run ended)."""
        while not self.done.is_set():
            if self._pids(attempt) is not None and self._phase(0, attempt) is not None:
                return self._step(0, attempt)
            time.sleep(0.1)
        return None

    def _step(self, rank: int, attempt: int) -> int:
        phase = self._phase(rank, attempt)
        return -1 if phase is None else int(phase.split()[-1])

    def _phase(self, rank: int, attempt: int) -> str | None:
        path = self.out / f"phase-rank{rank}"
        text = path.read_text() if path.exists() else ""
        return text.rsplit(" attempt ", 1)[0] if text.endswith(f" attempt {attempt}") else None


def losses_by_step(found: dict, attempts: list[int]) -> tuple[dict[int, float], dict[int, dict], int]:
    """Rank 0's loss and data position for each step (the last attempt that ran it wins), and
    how many steps were run more than once."""
    losses, positions, runs = {}, {}, 0
    for a in attempts:
        r = found.get((a, 0), {"losses": {}, "positions": {}})
        runs += len(r["losses"])
        losses.update({int(k): v for k, v in r["losses"].items()})
        positions.update({int(k): v for k, v in r["positions"].items()})
    return losses, positions, runs - len(losses)


def attempt_end(found: dict, attempt: int) -> str:
    """How an attempt ended, from the ranks that could tell (a killed or stopped rank cannot)."""
    ends = [found[(attempt, r)]["end"] for r in range(NPROC) if (attempt, r) in found]
    told = [e for e in ends if e not in ("running", "stopped")]
    return (told or ["killed (no rank could tell)"])[0][:600]


def run_uninterrupted(args: argparse.Namespace, train: list[str], ref_dir: Path, run_dir: Path):
    """The reference run, in a fresh directory: (loss by step, data position by step, seconds)."""
    for d in (ref_dir, run_dir):  # a fresh start: an old checkpoint there would be resumed from
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    started = time.time()
    ref = launch(ref_dir, "", [*train, "--checkpoint-dir", str(ref_dir / "ckpt")], 0)
    if ref.wait() != 0:
        sys.exit(f"the uninterrupted run failed; see {ref_dir / 'torchrun.log'}")
    reference, ref_positions, _ = losses_by_step(records(ref_dir), [0])
    if sorted(reference) != list(range(args.steps)):
        sys.exit(f"the uninterrupted run did not run steps 0..{args.steps - 1}; see {ref_dir}")
    return reference, ref_positions, time.time() - started


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(ROOT))  # examples._lane: the number flags' types
    from examples._lane import at_least, non_negative_float, output_file, positive_float

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=at_least(0), default=6, help="random SIGKILLs (one per attempt)")
    parser.add_argument("--stops", type=at_least(0), default=0, help="random SIGSTOPs (each costs torchrun's 30 s)")
    parser.add_argument("--steps", type=at_least(1), default=60)
    parser.add_argument("--save-every", type=at_least(1), default=3)
    parser.add_argument("--timeout", type=positive_float, default=20.0)
    parser.add_argument("--span", type=at_least(1), default=8, help="a fault comes 1..span steps into an attempt")
    parser.add_argument("--jitter", type=non_negative_float, default=0.3, help="and 0..jitter seconds into that step")
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--workdir", type=Path, default=Path("runs") / "kill_ranks")
    parser.add_argument("--json", type=output_file, default=Path("runs") / "kill_ranks.json")
    args = parser.parse_args(argv)
    train = ["--backend", "dtensor", "--layers", "2", "--d-model", "64", "--seq", "32", "--vocab", "64"]
    train += ["--batch", "16", "--steps", str(args.steps), "--dataset-rows", "512", "--lr", "1e-2"]
    train += ["--save-every", str(args.save_every), "--timeout", str(args.timeout)]
    ref_dir, run_dir = args.workdir / "reference", args.workdir / "faulty"
    reference, ref_positions, ref_seconds = run_uninterrupted(args, train, ref_dir, run_dir)

    save_step = args.save_every * 2 - 1  # the second save of attempt 0
    plan = f"killsave:{random.Random(args.seed).randrange(NPROC)}:{save_step}@0"
    restarts = 1 + args.kills + args.stops
    killer = Killer(run_dir, args.kills, args.stops, args.span, args.jitter, args.seed)
    started = time.time()
    run = launch(run_dir, plan, [*train, "--checkpoint-dir", str(run_dir / "ckpt")], restarts)
    killer.start()
    code = run.wait()
    killer.done.set()
    seconds = time.time() - started
    found = records(run_dir)
    attempts = sorted({a for a, _ in found})
    got, positions, redone = losses_by_step(found, attempts)
    differing = [s for s in reference if s in got and abs(got[s] - reference[s]) > 1e-4 * abs(reference[s])]
    result = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "exit_code": code,
        "attempts": len(attempts),
        "first_steps": [found.get((a, 0), {}).get("first_step") for a in attempts],
        "ends": [attempt_end(found, a) for a in attempts],
        "deterministic_fault": plan,
        "random_faults": killer.events,
        "random_faults_planned": args.kills + args.stops,
        "steps_missing": sorted(set(reference) - set(got)),
        "steps_with_other_loss": differing,
        "steps_with_other_data": [s for s in ref_positions if positions.get(s) != ref_positions[s]],
        "steps_redone": redone,
        "final_loss": {"uninterrupted": reference[max(reference)], "killed": got.get(max(reference))},
        "seconds": {"uninterrupted": round(ref_seconds, 1), "killed": round(seconds, 1)},
    }
    report(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.json)  # atomic: a run killed here leaves the last complete report
    return result


def report(r: dict) -> None:
    print(f"{'attempt':>7}  {'fault that ended it':40s}  resumed at step")
    faults = [r["deterministic_fault"] + " (kill in a save)"]
    faults += [f"{e['action']} rank {e['rank']} in '{e['phase']}'" for e in r["random_faults"]]
    for i, first in enumerate(r["first_steps"]):
        fault = faults[i] if i < len(faults) else "-"
        print(f"{i:7d}  {fault:40s}  {'nothing left to run' if first is None else first}")
    lost = len(r["steps_missing"]) + len(r["steps_with_other_loss"]) + len(r["steps_with_other_data"])
    print(
        f"\nexit {r['exit_code']}, {r['attempts']} attempts, {len(r['random_faults'])} of "
        f"{r['random_faults_planned']} random faults injected; lost: {lost} steps (missing {r['steps_missing']}, "
        f"other loss {r['steps_with_other_loss']}, other data {r['steps_with_other_data']}); redone: "
        f"{r['steps_redone']} steps"
    )
    final = r["final_loss"]
    print(f"final loss: uninterrupted {final['uninterrupted']:.6f}, killed {final['killed']}")
    print(f"time: uninterrupted {r['seconds']['uninterrupted']} s, killed {r['seconds']['killed']} s")


if __name__ == "__main__":
    main()
