"""Healing HSDP under chaos: 2 replica groups x 2 ranks train while a driver SIGKILLs a random rank
every 20 to 40 steps; print what the kills cost, and the overhead of torchft with no failure.

Three runs of examples/train_heal.py (4 gloo processes each), in this order:

1. plain HSDP: one torchrun of 4 ranks, mesh (data 2, fsdp 2), no torchft;
2. healing, failure-free: a lighthouse and two torchrun groups of 2 ranks (`fsdp_xla.ft`);
3. healing under chaos: the same, while this script kills a random rank of a random group each
   time the run has gone 20 to 40 steps past the previous kill (and the previous kill has healed;
   not in the last ``--quiet-tail`` steps, so every kill heals before the run ends). torchrun
   restarts only the killed rank's group (``--max-restarts``); the job as a whole never restarts.

Reported: kills, heals, steps lost (step attempts that did not commit, on any group), time to
heal (from the kill to the killed group's first committed step, when its weights equal the
peer's), the steps trained with one group instead of two, the step-time ratio of run 2 to run 1
(median step time of rank 0 of each group, past the first 10 steps), the final loss (mean of the
last 10 steps) against run 2's, the largest relative loss difference per step against run 2, and
whether the weight shards of the two groups were bitwise equal at every step both committed.

    python benchmarks/chaos_heal.py --steps 300 --json runs/chaos_heal.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's fsdp_xla, not an installed one
SCRIPT = ROOT / "examples" / "train_heal.py"
GROUPS, NPROC = 2, 2


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM"))}
    env.update(PYTHONPATH=str(ROOT), USE_TORCH_XLA="0")
    return env


def read_records(out: Path) -> list[dict]:
    """Every JSON line the ranks wrote (a line being written is skipped)."""
    found = []
    for path in sorted(out.glob("replica*-rank*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def steps_of(records: list[dict]) -> list[dict]:
    return [r for r in records if "step" in r]


class Killer(threading.Thread):
    """Kill a random rank each time the run is ``gap`` (random in ``gaps``) steps past the previous
    kill, once every group trains with all groups again; never in the last ``tail`` steps."""

    def __init__(self, out: Path, steps: int, gaps: tuple[int, int], kills: int, tail: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.out, self.steps, self.gaps, self.kills, self.tail = out, steps, gaps, kills, tail
        self.random, self.events, self.done = random.Random(seed), [], threading.Event()

    def _state(self) -> tuple[int, bool, dict]:
        """(highest committed step, healed: every rank of the last killed group committed a step
        in a newer attempt with every group taking part, {(group, rank): (attempt, pid)})."""
        records = read_records(self.out)
        latest: dict[tuple[int, int], tuple[int, int]] = {}
        for r in records:
            if r.get("event") == "start":
                key = (r["replica"], r["rank"])
                latest[key] = max(latest.get(key, (-1, 0)), (r["attempt"], r["pid"]))
        committed = [r for r in steps_of(records) if r["committed"]]
        healed = True
        if self.events:
            kill = self.events[-1]
            back = {
                r["rank"]
                for r in committed
                if r["replica"] == kill["replica"]
                and r["attempt"] > kill["attempt"]
                and r["participants"] == GROUPS
                and not r["healing"]
            }
            healed = len(back) == NPROC
        return max((r["step"] for r in committed), default=-1), healed, latest

    def run(self) -> None:
        target = self.random.randint(*self.gaps)
        while not self.done.is_set() and len(self.events) < self.kills:
            step, healed, latest = self._state()
            if step >= self.steps - self.tail:
                return
            if step >= target and healed and len(latest) == GROUPS * NPROC:
                victim = (self.random.randrange(GROUPS), self.random.randrange(NPROC))
                attempt, pid = latest[victim]
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # its group is restarting after all: choose again
                    continue
                kill = {"time": time.time(), "step": step, "replica": victim[0], "rank": victim[1], "attempt": attempt}
                self.events.append(kill)
                target = step + self.random.randint(*self.gaps)
            time.sleep(0.05)


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` and every process below it (torchrun starts its workers in sessions
    of their own, so killing torchrun alone leaves them running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    todo, found = [process.pid], []
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def set_aside_previous_run(out: Path) -> Path | None:
    """Move a previous run's records in ``out`` to ``out.<time>`` (returned; ``None`` when there
    were none). The ranks append to their record files across restarts, so a second run into the
    same directory read both runs' steps as one, and its groups found the first run's start marks
    (``train_heal.py --start-together``) and did not wait for each other."""
    if not out.is_dir() or not any(out.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kept = out.with_name(f"{out.name}.{stamp}")
    n = 1
    while kept.exists():  # two runs in one second
        kept, n = out.with_name(f"{out.name}.{stamp}-{n}"), n + 1
    os.replace(out, kept)
    print(f"chaos_heal.py: the previous run's records are now in {kept}", flush=True)
    return kept


def run_healing(
    out: Path, steps: int, args: argparse.Namespace, killer: Killer | None, more: tuple[str, ...] = ()
) -> float:
    """Run 2 or 3 (with ``killer``; ``more``: more arguments of examples/train_heal.py); returns
    its wall time in seconds."""
    from fsdp_xla import ft

    out.mkdir(parents=True, exist_ok=True)
    train = ["--steps", str(steps), "--records", str(out), "--timeout", str(args.timeout), *more]
    # Every group must take part from step 0: with a quorum of one, the group that starts first
    # trains alone on half the batch until the other joins, and the run is no longer the
    # failure-free one. Without a killer the lighthouse asks for every group; under the killer a
    # quorum of one is the point (the live group trains on), so the groups start together instead.
    if killer is not None:
        train += ["--digest", "--min-step-seconds", str(args.min_step_seconds), "--start-together"]
    quorum = 1 if killer is not None else GROUPS
    start = time.time()
    with ft.Lighthouse(min_replicas=quorum, bind="[::]:0", heartbeat_timeout=args.heartbeat_timeout) as lighthouse:
        groups = ft.launch_groups(
            SCRIPT,
            train,
            lighthouse=lighthouse.address,
            groups=GROUPS,
            nproc_per_group=NPROC,
            max_restarts=args.max_restarts,
            env=child_env(),
            log_dir=out,
        )
        if killer is not None:
            killer.start()
        try:
            codes = [g.wait(timeout=args.run_timeout) for g in groups]
        finally:
            if killer is not None:
                killer.done.set()
            for g in groups:
                if g.poll() is None:
                    kill_tree(g)
    if any(codes):
        raise RuntimeError(f"a replica group failed ({codes}); see {out}/group*.log")
    return time.time() - start


def run_plain(out: Path, steps: int, args: argparse.Namespace, more: tuple[str, ...] = ()) -> float:
    """Run 1: plain HSDP on 4 ranks, no torchft; returns its wall time in seconds."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(GROUPS * NPROC)]
    command += [str(SCRIPT), "--plain", "--groups", str(GROUPS), "--steps", str(steps), "--records", str(out), *more]
    start = time.time()
    with open(out / "plain.log", "w") as log:
        subprocess.run(
            command, env=child_env(), stdout=log, stderr=subprocess.STDOUT, check=True, timeout=args.run_timeout
        )
    return time.time() - start


def median_step_time(records: list[dict], skip: int = 10) -> float:
    """Median seconds per committed step of rank 0 of every group, past the first ``skip`` steps."""
    times = [r["t1"] - r["t0"] for r in steps_of(records) if r["rank"] == 0 and r["committed"] and r["step"] >= skip]
    return statistics.median(times)


def losses(records: list[dict]) -> dict[tuple[int, int], float]:
    """{(group, step): mean loss over the group's ranks}, for the steps it committed and took part in."""
    by: dict[tuple[int, int], list[float]] = {}
    for r in steps_of(records):
        if r["committed"] and not r.get("healing"):
            by.setdefault((r["replica"], r["step"]), []).append(r["loss"])
    return {k: statistics.fmean(v) for k, v in by.items()}


def heals(records: list[dict], kills: list[dict]) -> list[dict]:
    """Per kill: when every rank of the killed group had committed a step in a newer attempt
    (after fetching the weights and optimizer state from the live group), how long after the kill
    that was, and at which step (``healed`` False if it never came)."""
    found = []
    for kill in kills:
        first: dict[int, dict] = {}
        for r in steps_of(records):
            back = r["replica"] == kill["replica"] and r["attempt"] > kill["attempt"] and r["committed"]
            # with every group again, and at the live group's step: a group that found no peer and
            # started over from step 0 has not healed
            if back and r["participants"] == GROUPS and r["step"] >= kill["step"]:
                first[r["rank"]] = min(first.get(r["rank"], r), r, key=lambda x: x["t1"])
        done = len(first) == NPROC
        found.append(
            {
                **kill,
                "healed": done,
                "seconds": max(r["t1"] for r in first.values()) - kill["time"] if done else None,
                "at_step": min(r["step"] for r in first.values()) if done else None,
            }
        )
    return found


def digests_compared(records: list[dict]) -> tuple[int, list[tuple[int, int]]]:
    """How many (step, rank) pairs both groups committed, and those whose weight shards differ."""
    by: dict[tuple[int, int], dict[int, str]] = {}
    for r in steps_of(records):
        if r["committed"] and r.get("digest"):
            by.setdefault((r["step"], r["rank"]), {})[r["replica"]] = r["digest"]
    both = {k: v for k, v in by.items() if len(v) == GROUPS}
    return len(both), sorted(k for k, v in both.items() if len(set(v.values())) > 1)


def loss_gap(chaos: dict, reference: dict) -> tuple[float, float, float]:
    """(largest relative difference of a group's loss at a step, final loss of each run: the mean
    over both groups of the last 10 steps)."""
    common = [k for k in chaos if k in reference]
    worst = max(abs(chaos[k] - reference[k]) / reference[k] for k in common)
    last = max(step for _, step in reference)

    def final(run: dict) -> float:
        return statistics.fmean(v for (_, step), v in run.items() if step > last - 10)

    return worst, final(chaos), final(reference)


def summarize(plain: list[dict], clean: list[dict], chaos: list[dict], kills: list[dict]) -> dict:
    healed = heals(chaos, kills)
    seconds = [h["seconds"] for h in healed if h["healed"]]
    compared, differing = digests_compared(chaos)
    worst, final_chaos, final_clean = loss_gap(losses(chaos), losses(clean))
    lead = [r for r in steps_of(chaos) if r["rank"] == 0]
    return {
        "kills": len(kills),
        "heals": sum(h["healed"] for h in healed),
        "steps_lost": sum(not r["committed"] for r in lead),
        "steps_with_one_group": len({r["step"] for r in lead if r["committed"] and r["participants"] < GROUPS}),
        "heal_seconds_median": statistics.median(seconds) if seconds else None,
        "heal_seconds_max": max(seconds) if seconds else None,
        "step_seconds_plain_hsdp": median_step_time(plain),
        "step_seconds_torchft": median_step_time(clean),
        "torchft_overhead_ratio": median_step_time(clean) / median_step_time(plain),
        "final_loss_chaos": final_chaos,
        "final_loss_failure_free": final_clean,
        "max_rel_loss_diff_per_step": worst,
        "digest_pairs_compared": compared,
        "digest_pairs_differing": len(differing),
        "heal_events": healed,
    }


def overhead_wide(args: argparse.Namespace) -> dict:
    """The overhead again with a wider student (a longer step, as a real model's)."""
    plain, healing = (median_step_time(read_records(args.out / n)) for n in ("plain_wide", "failure_free_wide"))
    return {
        "wide_hidden": args.overhead_hidden,
        "wide_step_seconds_plain_hsdp": plain,
        "wide_step_seconds_torchft": healing,
        "wide_torchft_overhead_ratio": healing / plain,
    }


def table(summary: dict) -> str:
    rows = [(k, v) for k, v in summary.items() if k != "heal_events"]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}" for k, v in rows]
    for h in summary["heal_events"]:
        lines.append(
            f"  kill at step {h['step']}: group {h['replica']} rank {h['rank']} -> healed {h['healed']}"
            + (f" in {h['seconds']:.1f} s at step {h['at_step']}" if h["healed"] else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--kills", type=int, default=100, help="at most this many kills")
    parser.add_argument("--gap", type=int, nargs=2, default=(20, 40), help="steps between kills: min max")
    parser.add_argument("--quiet-tail", type=int, default=30, help="no kill in the last this many steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heartbeat-timeout", type=float, default=2.0, help="the lighthouse's (s)")
    parser.add_argument("--timeout", type=float, default=10.0, help="cross-group collective timeout (s)")
    parser.add_argument("--max-restarts", type=int, default=100)
    parser.add_argument(
        "--min-step-seconds",
        type=float,
        default=1.0,
        help="chaos run only: pad each step to this long (a larger model's step; a restart takes seconds)",
    )
    parser.add_argument("--overhead-hidden", type=int, default=4096, help="the wider student's width")
    parser.add_argument("--overhead-steps", type=int, default=60, help="steps of each wide run")
    parser.add_argument("--run-timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=Path("runs/chaos_heal"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    set_aside_previous_run(args.out)
    os.environ.setdefault("RUST_LOG", "warn")  # the lighthouse in this process: one line per quorum otherwise
    walls = {"plain": run_plain(args.out / "plain", args.steps, args)}
    walls["failure_free"] = run_healing(args.out / "failure_free", args.steps, args, None)
    wide = ("--hidden", str(args.overhead_hidden))
    walls["plain_wide"] = run_plain(args.out / "plain_wide", args.overhead_steps, args, wide)
    walls["failure_free_wide"] = run_healing(args.out / "failure_free_wide", args.overhead_steps, args, None, wide)
    killer = Killer(args.out / "chaos", args.steps, tuple(args.gap), args.kills, args.quiet_tail, args.seed)
    walls["chaos"] = run_healing(args.out / "chaos", args.steps, args, killer)
    runs = [read_records(args.out / name) for name in ("plain", "failure_free", "chaos")]
    summary = {**summarize(*runs, killer.events), **overhead_wide(args), "wall_seconds": walls, "steps": args.steps}
    print(table(summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        partial = args.json.with_name(args.json.name + ".partial")
        partial.write_text(json.dumps(summary, indent=1))
        os.replace(partial, args.json)  # whole or not at all
    return 0


if __name__ == "__main__":
    sys.exit(main())
