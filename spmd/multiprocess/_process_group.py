"""Start torch.distributed so that a hung collective ends: `init_process_group` and the heartbeat.

``dist.init_process_group(timeout=...)`` alone leaves three gaps, each measured on gloo (torch
2.9 and 2.15) with one rank SIGSTOPped:

- the timeout covers the world group only: an axis group of a 2-D mesh waits 30 minutes (the
  dtensor backend now gives every group of its meshes the world's timeout);
- the error says ``Timed out waiting 4000ms for send operation to complete``: no collective,
  no rank;
- the ranks that wait cannot tell which rank stopped.

`init_process_group(timeout=T)` starts the group with a collective timeout a little under ``T``
(the rest is for the diagnosis), turns on torch's flight recorder (which names the collective
that was waiting) and starts a heartbeat: a daemon thread that writes a counter and this rank's
current label into the job's store (torchrun's agent store, outside every worker, so a stopped
worker cannot block it) every ``T / 15`` seconds. `spmd.watch_collectives` reads both when a
collective fails (`spmd.multiprocess`).
"""

from __future__ import annotations

import atexit
import inspect
import os
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from mesh.checks import is_real
from spmd.errors import ProcessGroupError, SpmdTypeError

__all__ = ["init_process_group", "Beat", "Heartbeat", "heartbeat", "timeouts_for"]

_FLIGHT_RECORDER_ENV = "TORCH_FR_BUFFER_SIZE"
_FLIGHT_RECORDER_ENTRIES = "2000"


@dataclass(frozen=True)
class Timeouts:
    """How a total timeout is spent: the collective waits ``collective``; then the diagnosis
    watches heartbeats for ``probe`` (the heartbeat beats every ``beat``)."""

    collective: timedelta
    probe: timedelta
    beat: timedelta


MAX_TIMEOUT = 30 * 24 * 3600.0  # seconds: longer is no timeout at all; much longer overflows timedelta


def timeouts_for(total: float) -> Timeouts:
    """Split ``total`` seconds: a fifth (1 to 5 s) for the diagnosis, the rest for the collective.

    Raises:
        SpmdTypeError: ``total`` is not a finite number of seconds from 1 to `MAX_TIMEOUT`
            (nan, inf or a huge number raised from inside ``timedelta``).
    """
    if not is_real(total) or not 1 < total <= MAX_TIMEOUT:  # nan, inf and a huge number would make timedelta raise
        raise SpmdTypeError(
            f"timeout must be a number of seconds above 1 and at most {MAX_TIMEOUT:.0f} (30 days), got {total!r:.60}. "
            "Give the longest a healthy collective may take, e.g. timeout=600; a hung one ends after it."
        )
    total = float(total)
    probe = min(5.0, max(1.0, total / 5))
    return Timeouts(timedelta(seconds=total - probe), timedelta(seconds=probe), timedelta(seconds=probe / 3))


@dataclass(frozen=True)
class Beat:
    """One rank's last heartbeat: its counter, the collectives it has issued on each of its
    groups (by group name), its label, and whether its process ended (the last beat of a
    process that exits through Python; a killed, stopped or hung one just stops beating)."""

    count: int
    issued: dict[str, int]
    label: str
    ended: bool = False

    def encode(self) -> str:
        issued = ";".join(f"{name}={n}" for name, n in self.issued.items()) or "-"
        return f"{self.count} {'ended' if self.ended else 'beating'} {issued} {self.label}"

    @classmethod
    def decode(cls, text: str) -> Beat:
        count, state, issued, label = (text.split(" ", 3) + ["", "", ""])[:4]
        pairs = [item.partition("=") for item in issued.split(";") if "=" in item]
        return cls(int(count), {name: int(n) for name, _, n in pairs}, label, state == "ended")


class Heartbeat:
    """A daemon thread writing this rank's `Beat` under ``rank<r>`` of a store every ``beat``
    seconds (and whenever the label changes)."""

    def __init__(self, store: Any, rank: int, world: int, timeouts: Timeouts) -> None:
        self.store, self.rank, self.world, self.timeouts = store, rank, world, timeouts
        self._label = "starting"
        self._count = 0
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="spmd-heartbeat", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # joined before the interpreter finalizes (no C++ call mid-teardown)

    @property
    def label(self) -> str:
        """What this rank is doing (`spmd.watch_collectives` sets it)."""
        return self._label

    @label.setter
    def label(self, value: str) -> None:
        self._label = value
        self._beat()  # now, from this thread: a rank that stops right after is seen at its new label

    def _beat(self, ended: bool = False) -> bool:
        """Write the next count and the label (the store client is thread-safe); False once
        the store is gone (the job is ending: nothing left to tell)."""
        with self._lock:
            self._count += 1
            count = self._count
        from spmd._util import torch_compat

        beat = Beat(count, torch_compat.group_sequence_numbers(), self._label, ended)
        try:
            self.store.set(f"rank{self.rank}", beat.encode())
        except RuntimeError:
            return False
        return True

    def _run(self) -> None:
        while not self._stop.is_set() and self._beat():
            self._stop.wait(self.timeouts.beat.total_seconds())

    def read(self) -> dict[int, Beat]:
        """Every rank's last `Beat` (ranks that never wrote are missing)."""
        out = {}
        for r in range(self.world):
            key = f"rank{r}"
            if self.store.check([key]):
                out[r] = Beat.decode(self.store.get(key).decode(errors="replace"))
        return out

    def stop(self) -> None:
        """Stop beating, wait for the thread, and write a last beat saying this process ended:
        the others' reports then tell a rank that exited from one that stopped or was killed
        (whose counter just stops). Once only: atexit calls it again. Not in a forked child (a
        DataLoader worker): its copy of the store client shares the parent's connection."""
        if self._stop.is_set() or os.getpid() != self._pid:
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._beat(ended=True)


# The process's heartbeat, like torch's own default process group: one per process, started by
# init_process_group.
_heartbeat: list[Heartbeat] = []


def heartbeat() -> Heartbeat | None:
    """This process's heartbeat, or ``None`` when `init_process_group` did not start one."""
    return _heartbeat[0] if _heartbeat else None


def _store(timeouts: Timeouts) -> Any:
    """A store client of this job's own (its own connection and timeout), under a prefix of
    this launch: torchrun's restarts reuse the store, so each attempt writes its own keys."""
    import torch.distributed as dist

    prefix = "spmd-heartbeat/{}/{}".format(
        os.environ.get("TORCHELASTIC_RUN_ID", "run"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    )
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timeouts.probe,
            wait_for_workers=False,
        )
    else:  # initialized another way (a file, a URL): the process group's own store
        from spmd._util import torch_compat

        store = torch_compat.default_store()
    return dist.PrefixStore(prefix, store)


def _attempt_store(timeouts: Timeouts) -> dict[str, Any]:
    """``store``, ``rank`` and ``world_size`` for a job on one torchrun node, or nothing.

    torchrun shares its own store with the workers (``TORCHELASTIC_USE_AGENT_STORE``) and keeps
    it across ``--max-restarts``, with no prefix per attempt: a restarted worker's gloo reads a
    peer's address left by the previous attempt and fails with "connectFullMesh failed ...
    Connection refused" (measured, plain torch 2.9 and 2.15: 4 of 6 restarts after a SIGKILLed
    worker; pytorch/pytorch#135712). On one node every worker sees the same restart count, so
    each attempt gets a prefix of its own here. On several nodes the counts may differ between
    nodes; there, launch with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (a new store each
    attempt; docs/multiprocess.md)."""
    import torch.distributed as dist

    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.get("GROUP_WORLD_SIZE", "1") != "1":
        return {}
    agent = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timeouts.collective + timeouts.probe
    )
    prefix = f"spmd-attempt/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return {"store": dist.PrefixStore(prefix, agent), "rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"])}


def _check_backend_name(backend: str, known: list[str]) -> None:
    """Every backend ``backend`` names (``"gloo"``, or per device ``"cpu:gloo,cuda:nccl"``) is
    one torch knows (registered ones included, TorchTPU's); torch's own check is an assert
    from deep inside process-group creation.

    Raises:
        SpmdTypeError: a name torch does not know, with the names it does.
    """
    names = [part.split(":")[-1].strip().lower() for part in backend.split(",")]
    unknown = [n for n in names if n not in known or n == "undefined"]
    if unknown:
        raise SpmdTypeError(
            f"init_process_group: backend {backend!r:.80} names {unknown[0]!r}, which this torch does not know; it "
            f"knows {[n for n in known if n != 'undefined']} (and devices as 'cpu:gloo,cuda:nccl'). Pass one of "
            "them, or None: NCCL with CUDA, else gloo."
        )


def _check_passed_on(kwargs: dict[str, Any], target: Any) -> None:
    """``kwargs`` are parameters of ``target`` (torch's ``init_process_group``): torch would raise
    its own TypeError from inside it."""
    try:
        known = set(inspect.signature(target).parameters) - {"backend", "timeout"}
    except (TypeError, ValueError):  # no signature to read: torch checks them itself
        return
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise SpmdTypeError(
            f"init_process_group got {unknown}, which torch.distributed.init_process_group does not take; it takes "
            f"backend, timeout= (seconds, here) and {sorted(known)}."
        )


def init_process_group(backend: str | None = None, *, timeout: float = 600.0, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` with a timeout that ends a hung collective.

    A collective that waits on a stopped, hung or dead rank fails after about ``timeout``
    seconds on every rank still running; inside `spmd.watch_collectives` the failure is a
    `CollectiveTimeoutError` naming the collective and the ranks. Under torchrun the job then
    ends and ``--max-restarts`` starts it again. Every group of the meshes the dtensor backend
    builds gets the same timeout.

    Args:
        backend: ``"gloo"``, ``"nccl"``...; ``None``: NCCL with CUDA, else gloo.
        timeout: seconds (above 1, at most 30 days) a collective may wait, diagnosis included.
        kwargs: passed on to ``torch.distributed.init_process_group``.

    Raises:
        SpmdTypeError: a backend that is not a name, or a keyword torch's function does not take.
        ProcessGroupError: this process's process group is already running.
    """
    import torch
    import torch.distributed as dist

    if backend is not None and not isinstance(backend, str):
        raise SpmdTypeError(
            f"init_process_group's backend is a name ('gloo' on CPU, 'nccl' on GPUs) or None to pick one, got "
            f"{backend!r:.60}. The timeout is the keyword timeout= (seconds)."
        )
    if backend is not None:
        _check_backend_name(backend, dist.Backend.backend_list)
    timeouts = timeouts_for(timeout)
    _check_passed_on(kwargs, dist.init_process_group)
    if dist.is_available() and dist.is_initialized():
        raise ProcessGroupError(
            f"init_process_group: this process already has its process group ({dist.get_backend()}, rank "
            f"{dist.get_rank()} of {dist.get_world_size()}). Start it once per process (torch.distributed."
            "is_initialized() tells), or end it first with torch.distributed.destroy_process_group()."
        )
    # The flight recorder names the collective that hung; torch reads this when a group is made.
    os.environ.setdefault(_FLIGHT_RECORDER_ENV, _FLIGHT_RECORDER_ENTRIES)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "store" not in kwargs and "init_method" not in kwargs:
        kwargs.update(_attempt_store(timeouts))
    dist.init_process_group(backend, timeout=timeouts.collective, **kwargs)
    _heartbeat[:] = [Heartbeat(_store(timeouts), dist.get_rank(), dist.get_world_size(), timeouts)]
