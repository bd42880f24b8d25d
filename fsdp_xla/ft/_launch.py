"""Start the replica groups of a healing HSDP run on this host: one torchrun per group, each
restarting its own workers when one dies (``--max-restarts``), so a lost rank costs its group a
restart and never the job. On several hosts, run each group's torchrun on its hosts instead."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from fsdp_xla.errors import FSDPError, FSDPTypeError
from mesh.checks import require_int

__all__ = ["LIGHTHOUSE_ENV", "REPLICA_ID_ENV", "launch_groups"]

# torchft's own names for them (its Manager and examples read these).
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
REPLICA_ID_ENV = "REPLICA_GROUP_ID"


def launch_groups(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    lighthouse: str,
    groups: int,
    nproc_per_group: int,
    max_restarts: int = 10,
    env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
) -> list[subprocess.Popen]:
    """Start ``groups`` torchrun jobs of ``nproc_per_group`` ranks each running ``script args``,
    with ``TORCHFT_LIGHTHOUSE`` and ``REPLICA_GROUP_ID`` (0, 1, ...) in their environment; returns
    their processes (group ``i`` at index ``i``). With ``log_dir``, group ``i`` writes
    ``group{i}.log`` there; else it inherits this process's output.

    Raises:
        FSDPTypeError: a count that is not an int.
        FSDPError: a count out of range (``groups`` < 1, ...), or ``script`` not a file.
    """
    require_int(groups, "launch_groups groups", FSDPTypeError, minimum=1, range_error=FSDPError)
    require_int(nproc_per_group, "launch_groups nproc_per_group", FSDPTypeError, minimum=1, range_error=FSDPError)
    require_int(max_restarts, "launch_groups max_restarts", FSDPTypeError, minimum=0, range_error=FSDPError)
    if not Path(script).is_file():
        raise FSDPError(f"launch_groups script={str(script)!r} is not a file: give the training script's path.")
    launched = []
    for group in range(groups):
        child = dict(os.environ if env is None else env)
        child[LIGHTHOUSE_ENV], child[REPLICA_ID_ENV] = lighthouse, str(group)
        # A new rendezvous store per restart: torchrun's shared one keeps the dead attempt's gloo
        # addresses, and a restarted group's plain dist.init_process_group reads them ("connectFullMesh
        # failed ... Connection refused"; spmd.init_process_group avoids it the other way).
        child.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
        # --monitor-interval: torchrun notices a dead worker (and restarts the group) this fast.
        command += [str(nproc_per_group), "--max-restarts", str(max_restarts), "--monitor-interval", "0.2"]
        command += [str(script), *args]
        out = open(log_dir / f"group{group}.log", "w") if log_dir is not None else None  # noqa: SIM115
        launched.append(subprocess.Popen(command, env=child, stdout=out, stderr=subprocess.STDOUT if out else None))
        if out is not None:
            out.close()  # the child holds its own copy
    return launched
