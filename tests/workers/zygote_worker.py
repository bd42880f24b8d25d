"""A warm parent for test launches (tests/torchrun.py, ``warm_launch``): it imports torch, DTensor,
the project and transformers once, then forks each launch's ranks from that state, so a 4-rank launch does
not pay four imports of torch (about 5 CPU s each on this 2-core machine, 14 s of wall time a
launch under torchrun).

Requests come one JSON line at a time on stdin: ``{"script", "args", "nproc", "cwd", "dir"}``.
For each, a leader process (its own session, re-parented to init) forks the ranks with the
environment torchrun gives its workers, writes their output to ``dir/stdout`` and
``dir/stderr``, stops the others when a rank fails (as torchrun's agent does), and writes the
launch's exit code to ``dir/returncode`` last. This process starts no thread, so forking it is
safe.

With ``--planner`` it imports jax and the planner too, for the planner tests' compiles
(tests/background.py, ``BackgroundRun(warm=True)``): a compile run is then one process (``nproc``
1) at the request's ``nice``, without 3 to 4 CPU s of imports. torchax is not imported here: its
environment starts jax's CPU client, and with it threads.
"""

import gc
import json
import os
import runpy
import signal
import socket
import sys
import time

# torchrun sets this for every launch of more than one process, before the ranks import torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy  # noqa: E402,F401
import torch  # noqa: E402,F401
import torch.distributed  # noqa: E402,F401
import torch.distributed.tensor  # noqa: E402,F401

# The Trainer's and the context-parallel launches import these in every rank: 1.8 CPU s each,
# paid here once. (USE_TORCH_XLA=0 is in this process's environment, as in the ranks'.)
import transformers  # noqa: E402,F401
from transformers import Trainer  # noqa: E402,F401

import fsdp_xla  # noqa: E402,F401
import mesh  # noqa: E402,F401
import spmd  # noqa: E402,F401

if sys.argv[1:] == ["--planner"]:
    import jax  # noqa: F401

    import spmd.hlo  # noqa: F401
    import spmd.plan.api  # noqa: F401
    import spmd.plan.compile.step  # noqa: F401
    import spmd.plan.predict  # noqa: F401
    import spmd.plan.request.models  # noqa: F401

# What was imported stays out of the ranks' garbage collections: a collection in a rank would
# walk every object of these imports and copy the pages it touches (CPython's gc.freeze, made
# for fork servers).
gc.freeze()

# A fork copies one thread only: with more, a lock another thread held would stay held in the ranks.
_threads = len(os.listdir("/proc/self/task"))
if _threads != 1:
    sys.exit(f"zygote_worker.py: {_threads} threads after the imports; forking them is not safe")

STOP_GRACE_SECONDS = 30  # torchrun's agent: SIGTERM, then SIGKILL after 30 s


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_environment(rank: int, nproc: int, port: int, run_id: str) -> dict[str, str]:
    """What torchrun's local agent sets for each worker (torch.distributed.elastic)."""
    size = str(nproc)
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "WORLD_SIZE": size, "LOCAL_WORLD_SIZE": size, "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": size, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }  # fmt: skip


def _exit_code(stop: SystemExit) -> int:
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def _run_rank(script: str, args: list[str], environment: dict[str, str]) -> None:
    """Run the script as ``python script args`` would, then end as the interpreter does (atexit
    hooks, flushed streams), without returning into the fork's caller."""
    import atexit
    import threading
    import traceback

    os.environ.update(environment)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = _exit_code(stop)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # joins non-daemon threads, as interpreter exit does
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _stop(pids: set[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while pids and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            pids.discard(pid)
        else:
            time.sleep(0.05)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _lower_priority(nice: int) -> None:
    """Nice this leader and the ranks it forks by ``nice``, and its session's autogroup too: the
    leader's session (``setsid``) is an autogroup of its own where the kernel has them (Linux's
    CONFIG_SCHED_AUTOGROUP, on here), and the scheduler shares the CPU between autogroups before
    it looks at a process's nice. Without it three nice-19 planner runs took 1.5 of the 2 cores
    from the test session (measured)."""
    if nice == 0:
        return
    os.nice(nice)
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write(str(nice))
    except OSError:  # no autogroups: the process's nice is all there is
        pass


def _lead(request: dict) -> int:
    """Fork the ranks, wait for them; the launch's exit code (1 when a rank failed, as torchrun)."""
    out = os.open(os.path.join(request["dir"], "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(os.path.join(request["dir"], "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.chdir(request["cwd"])
    _lower_priority(request.get("nice", 0))
    port, nproc = _free_port(), request["nproc"]
    running = set()
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            _run_rank(request["script"], request["args"], _rank_environment(rank, nproc, port, str(os.getppid())))
        running.add(pid)
    while running:
        pid, status = os.waitpid(-1, 0)
        running.discard(pid)
        if os.waitstatus_to_exitcode(status) != 0:
            _stop(running)
            return 1
    return 0


def _write_whole(path: str, value: int) -> None:
    """Written to a side file, then renamed: the test polling ``path`` never reads half of it."""
    with open(path + ".tmp", "w") as file:
        file.write(str(value))
    os.replace(path + ".tmp", path)


def _launch(request: dict) -> None:
    """Leader in a grandchild (its own session; init reaps it), so this process stays clean."""
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    _write_whole(os.path.join(request["dir"], "pid"), os.getpid())
    _write_whole(os.path.join(request["dir"], "returncode"), _lead(request))
    os._exit(0)


def main() -> None:
    for line in sys.stdin:
        _launch(json.loads(line))
        os.waitpid(-1, 0)  # the intermediate child, which exits at once


if __name__ == "__main__":
    main()
