"""Run under torchrun --max-restarts by test_multiprocess.py: examples/train_fsdp.py with faults.

    torchrun --nproc_per_node 4 --max-restarts 3 tests/train_fsdp_fault_worker.py OUT_DIR FAULTS TRAIN_ARGS...

FAULTS is a comma-separated plan ``KIND:RANK:STEP@ATTEMPT`` (ATTEMPT: torchrun's restart count):

- ``kill``: the rank SIGKILLs itself after the step's loss (the step done, not yet saved);
- ``killsave``: the rank SIGKILLs itself in the save after the step, right after writing its
  shard file (the version is half written: LATEST must keep the previous one);
- ``stop``: the rank SIGSTOPs itself as the step starts; once the others have failed and
  torchrun's SIGTERM is pending for it, a watcher process SIGKILLs it (`kill_when_terminated`);
- ``killmid``: the rank SIGKILLs itself 2 s after the step starts, when the others wait for it
  in the step's first collective (their connections to it close mid-collective).

Every rank writes OUT_DIR/attempt<A>-rank<R>.json: the steps it ran with their losses, the step
it resumed from, and the error that ended it (a `CollectiveTimeoutError` or `PeerLostError`
with its time; the faulty rank the time of its fault), or ``done``; and, for
benchmarks/kill_ranks.py, its pid (pid-a<A>-rank<R>) and what it is doing (phase-rank<R>:
``step N`` or ``save N``).
"""

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from examples import train_fsdp
from fsdp_xla import checkpoint

out, plan, train_args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
faults = [f.replace("@", ":").split(":") for f in plan.split(",") if f]
mine = {(kind, int(step)) for kind, r, step, a in faults if int(r) == rank and int(a) == attempt}
record = {"attempt": attempt, "rank": rank, "losses": {}, "positions": {}, "first_step": None, "end": "running"}
report = out / f"attempt{attempt}-rank{rank}.json"
saving = {"step": None}
(out / f"pid-a{attempt}-rank{rank}").write_text(str(os.getpid()))
phase = out / f"phase-rank{rank}"


def write():
    # torchrun SIGKILLs the other ranks when one fails, maybe mid-write: a reader sees the old
    # record or the new one, never a truncated file.
    partial = report.with_name(f".{report.name}.partial")
    partial.write_text(json.dumps(record))
    os.replace(partial, report)


# A SIGSTOPped rank holds torchrun's SIGTERM pending (spmd's SigtermHold has a handler installed
# while a collective runs, and a handled signal waits for SIGCONT), so torchrun's restart waited
# its 30 s grace before its SIGKILL: 30 s of a 93 s test doing nothing (measured). The watcher
# gives the same SIGKILL once the SIGTERM is pending: the others failed and torchrun is ending
# the attempt, which is what the test checks; the 30 s grace is torchrun's, not ours.
WATCH = """
import os, signal, sys, time
pid, term = int(sys.argv[1]), 1 << (signal.SIGTERM - 1)
deadline, stopped = time.monotonic() + 600, False
while time.monotonic() < deadline:
    try:
        status = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status").read().splitlines() if ":" in l)
    except OSError:
        break  # gone
    if status["State"].split()[0] != "T":
        if stopped:
            break  # running again (or exiting): not ours to kill
        time.sleep(0.05)  # not stopped yet
        continue
    stopped = True
    if (int(status["ShdPnd"], 16) | int(status["SigPnd"], 16)) & term:
        os.kill(pid, signal.SIGKILL)
        break
    time.sleep(0.2)
"""


def kill_when_terminated():
    """Start a process that SIGKILLs this one once it is stopped with a SIGTERM pending."""
    subprocess.Popen(
        [sys.executable, "-S", "-c", WATCH, str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def hook(event, step, info):
    phase.write_text(f"{'save' if event == 'save' else 'step'} {step} attempt {attempt}")
    if event == "step":
        record["first_step"] = step if record["first_step"] is None else record["first_step"]
        record["positions"][step] = info["position"]
        if ("stop", step) in mine:
            record["end"], record["stopped_at"] = "stopped", time.time()
            write()
            kill_when_terminated()
            os.kill(os.getpid(), signal.SIGSTOP)
        if ("killmid", step) in mine:
            time.sleep(2)  # the others reach the step's first collective and wait there for this rank
            record["end"], record["killed_at"] = "killed", time.time()
            write()
            os.kill(os.getpid(), signal.SIGKILL)
    elif event == "loss":
        record["losses"][step] = info["loss"]
        write()
        if ("kill", step) in mine:
            os.kill(os.getpid(), signal.SIGKILL)
    elif event == "save":
        saving["step"] = step


write_device_file = checkpoint._save.write_device_file


def write_then_die(path, tensors):
    write_device_file(path, tensors)
    if ("killsave", saving["step"]) in mine:
        os.kill(os.getpid(), signal.SIGKILL)


checkpoint._save.write_device_file = write_then_die
try:
    train_fsdp.main(train_args, hook=hook)
    record["end"] = "done"
except Exception as e:
    record["end"] = f"{type(e).__name__}: {e}"
    record["failed_at"] = time.time()
    record["traceback"] = traceback.format_exc()[-3000:]
    write()
    raise
write()
