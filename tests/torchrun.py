"""Child processes started by tests: the environment they get, and torchrun launches (CPU, gloo)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(*, xla: bool = True) -> dict[str, str]:
    """This process's environment for a child Python process, with the project importable.

    ``xla=True``: without this session's device count, XLA flags and HLO debug setting, so the
    child configures its own devices (``PJRT_DEVICE`` stays). ``xla=False``: no XLA, PJRT or
    device settings at all (torchrun jobs, TPU compiles).
    """
    if xla:
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XLA_HLO_DEBUG", "CPU_NUM_DEVICES")}
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def torchrun(script: Path, nproc: int, *args: str, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``script`` with ``nproc`` processes; the project importable, no XLA device settings.

    ``USE_TORCH_XLA=0`` keeps transformers/accelerate from importing torch_xla (they do whenever it
    is installed), as on a machine without it: the dtensor backend must not need it.
    """
    env = child_env(xla=False)
    env["USE_TORCH_XLA"] = "0"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), str(script), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
