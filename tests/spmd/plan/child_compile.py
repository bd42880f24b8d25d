"""One helper for the planner tests that lower or compile a step in a fresh interpreter (libtpu
and jax stay out of the test session, torch_xla out of its environment)."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.torchrun import ROOT, child_env


def run_on_config(code: str, config: dict, tmp_path: Path, *args: str, timeout: float) -> Any:
    """Run ``code`` (``python -c``) with the model ``config`` written to a JSON file as its first
    argument and ``args`` after it; return the JSON of the last line it printed."""
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-c", code, str(path), *args], cwd=ROOT, env=child_env(xla=False),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])
