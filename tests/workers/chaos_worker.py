"""Started by tests/fsdp_xla/chaos_runs.py, beside the other tests: one of test_ft_chaos.py's runs
of benchmarks/chaos_heal.py, writing the ranks' records into OUT/PART.

    python tests/workers/chaos_worker.py OUT heal|fallback

``heal``: 2 groups x 2 ranks train STEPS steps under a lighthouse while a driver SIGKILLs one
random rank; prints the kill as JSON. ``fallback``: both groups run to step 12 saving every 5
steps, then again to step 16 from their checkpoints (records in OUT/fallback/first and /again).
"""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fsdp_xla.chaos_runs import HEAL_STEPS, STEP_SECONDS  # noqa: E402


def _bench():
    spec = importlib.util.spec_from_file_location("chaos_heal", ROOT / "benchmarks" / "chaos_heal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def heal(bench, out: Path) -> list[dict]:
    args = argparse.Namespace(
        timeout=10.0, min_step_seconds=STEP_SECONDS, heartbeat_timeout=2.0, max_restarts=2, run_timeout=170.0
    )
    killer = bench.Killer(out, HEAL_STEPS, gaps=(10, 14), kills=1, tail=30, seed=1)
    bench.run_healing(out, HEAL_STEPS, args, killer)  # raises if a group's torchrun did not end with 0
    return killer.events


def fallback(bench, out: Path) -> list[dict]:
    args = argparse.Namespace(
        timeout=10.0, min_step_seconds=0.0, heartbeat_timeout=2.0, max_restarts=0, run_timeout=170.0
    )
    saves = ("--checkpoint", str(out / "checkpoints"), "--save-every", "5")
    bench.run_healing(out / "first", 12, args, None, saves)
    bench.run_healing(out / "again", 16, args, None, saves)
    return []


if __name__ == "__main__":
    out, part = Path(sys.argv[1]) / sys.argv[2], sys.argv[2]
    events = {"heal": heal, "fallback": fallback}[part](_bench(), out)
    print(json.dumps({"kills": events}))
