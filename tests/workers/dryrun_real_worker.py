"""A torchrun worker for the dry-run tests: runs a training script as this real rank (gloo, real
tensors) under the inspector's `Recorder`, the one the dry run uses, and writes the steps it
recorded to ``OUT/rank<r>.json``.

    torchrun --nproc_per_node 4 tests/workers/dryrun_real_worker.py OUT STEPS SCRIPT [ARGS]
"""

import json
import os
import runpy
import sys
from pathlib import Path

from spmd.inspector._dtensor_record import Recorder, StopScript
from spmd.inspector._dtensor_report import _step_dict


def main() -> None:
    out, steps, script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    with Recorder(int(steps)) as recorder:
        try:
            runpy.run_path(script, run_name="__main__")
        except StopScript:
            pass
    rank = int(os.environ["RANK"])
    Path(out, f"rank{rank}.json").write_text(json.dumps([_step_dict(s) for s in recorder.steps]))


if __name__ == "__main__":
    main()
