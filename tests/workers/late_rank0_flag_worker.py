"""Run under torchrun by tests/test_examples.py: a flag every rank refuses, with rank 0 reaching
its parser seconds after the others (as when it imports slower on a loaded host).

    torchrun --nproc_per_node 2 tests/workers/late_rank0_flag_worker.py --steps x

The examples' parser prints the error on rank 0 only; a quiet rank that exited at once made
torchrun stop rank 0 before it printed, and the run failed with no error line.
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import _lane  # noqa: E402 - the examples' own helper, beside them

LATE_SECONDS = 3.0  # far beyond torchrun's monitor interval (0.1 s): it sees rank 1's exit first

if os.environ["RANK"] == "0":
    time.sleep(LATE_SECONDS)
parser = _lane.ArgumentParser(prog="late_rank0_flag_worker.py")
parser.add_argument("--steps", type=int, required=True)
parser.parse_args(sys.argv[1:])
