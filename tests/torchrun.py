"""Launch a script under torchrun from a test (CPU, gloo): one home for the environment it needs."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def torchrun(script: Path, nproc: int, *args: str, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``script`` with ``nproc`` processes; the project importable, no XLA device settings.

    ``USE_TORCH_XLA=0`` keeps transformers/accelerate from importing torch_xla (they do whenever it
    is installed), as on a machine without it: the dtensor backend must not need it.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM"))}
    env["PYTHONPATH"] = str(ROOT)
    env["USE_TORCH_XLA"] = "0"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), str(script), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
