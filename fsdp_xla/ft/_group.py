"""`ReplicaGroup`: this torchrun job as one replica group of a healing HSDP run (torchft).

One torchft ``Manager`` per rank (torchft's design: rank ``k`` of every group forms one
cross-group process group, and recovers from rank ``k`` of a peer), a reconfigurable process
group for the cross-group all-reduce, and the state a replacement fetches. The group's own ranks
(``torch.distributed``'s world under torchrun) are FSDP's shard axes; nothing here touches them.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from fsdp_xla._replicas import ReplicaSync
from fsdp_xla.errors import FaultToleranceError, FSDPError, FSDPTypeError
from fsdp_xla.ft._state import ShardState
from fsdp_xla.ft._torchft import torchft_module
from mesh.checks import require_bool, require_int, require_real, require_str

__all__ = ["ReplicaGroup"]


def _fresh_store(host: str) -> tuple[Any, str, int]:
    """A TCPStore for this incarnation of the group: rank 0 hosts it on a free port and the
    others learn the port through the group's own process group. torchrun's store outlives a
    restart of the group, and a Manager on it would read the dead incarnation's addresses
    (torchft's own tests give every attempt a new store too)."""
    store = None
    if dist.get_rank() == 0:
        store = dist.TCPStore(host_name=host, port=0, is_master=True, wait_for_workers=False)
    where = [host, store.port if store is not None else 0]
    dist.broadcast_object_list(where, src=0)
    return store, where[0], int(where[1])


def _cross_group_pg(timeout: timedelta) -> Any:
    """torchft's reconfigurable process group for the group's backend."""
    process_group = torchft_module("torchft.process_group")
    backend = dist.get_backend()
    if backend == "gloo":
        return process_group.ProcessGroupGloo(timeout=timeout)
    if backend == "nccl":
        return process_group.ProcessGroupNCCL(timeout=timeout)
    raise FaultToleranceError(
        f"healing HSDP: this group's process group is {backend!r}, and torchft 0.2.0 reconfigures only gloo and "
        "NCCL (ProcessGroupGloo, ProcessGroupNCCL) across replica groups. Initialize the group with "
        "dist.init_process_group('gloo') (CPU) or 'nccl' (GPUs); TorchTPU's process group is not one of them."
    )


def average_over_live_groups(manager: Any, cross_group: Any) -> Callable[[torch.Tensor], None]:
    """FSDP2's all-reduce hook for healing HSDP: average a unit's reduce-scattered gradient shard,
    in place, over the replica groups taking part in this step.

    What torchft's ``Manager.allreduce`` does (through its ``ManagedProcessGroup``), called on the
    reconfigurable process group directly: wait for the step's quorum, send zeros while this group
    is being healed, sum, divide by the participants; an error (a lost peer, the group's timeout)
    is reported to the manager, which then drops the step on every rank of the group
    (``should_commit``). torchft's own path wraps each all-reduce's future in a chain of callbacks
    and a timer on its timeout thread, measured at about 1 ms a unit and 3 ms of CPU a step on
    gloo (benchmarks/ft_overhead.py); the process group's own timeout (``ReplicaGroup(timeout=)``)
    bounds the wait here instead.
    """
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.SUM

    def all_reduce(shard: torch.Tensor) -> None:
        participants = manager.num_participants()  # waits for the quorum zero_grad() started
        if manager.errored() is not None:
            return  # the step is dropped already (a failed quorum or all-reduce): spare the wait
        if not manager.is_participating():
            shard.zero_()  # healing: the live groups' sum must not count this group's gradient
        try:
            cross_group.allreduce([shard], options).wait()
        except Exception as e:  # noqa: BLE001 - any failure drops the step; the next quorum rebuilds the group
            manager.report_error(e)
            return
        shard.div_(participants)

    return all_reduce


class ReplicaGroup(ReplicaSync):
    """This torchrun job as one replica group of a healing HSDP run.

    Give it to FSDP as the replicate axis, train through `optimizer`, and the gradients are
    averaged over the replica groups alive at each step; a group that restarts fetches the
    weights and optimizer state from a live peer before its first step counts.

    Args:
        lighthouse: the lighthouse's address (``python -m fsdp_xla.ft lighthouse`` prints it).
        replica_id: this group's number, the same on all its ranks and across its restarts.
        min_replicas: the fewest replica groups a step may commit with.
        timeout: how long a cross-group collective, a commit or a checkpoint fetch may take before
            the step is dropped (seconds).
        quorum_timeout: how long to wait for the lighthouse's quorum (seconds).
        init_sync: at step 0, replica groups other than the first take its weights, and add no
            gradient to that step. Turn it off when every group builds the same weights (one
            seed, or FSDP's deferred init with one ``init_seed``): step 0 then averages them all.
        hostname: the name other hosts reach this one by.

    Raises:
        FSDPTypeError: an argument of the wrong type (``replica_id`` not an int, ...).
        FSDPError: an argument out of range (``replica_id`` < 0, a timeout <= 0, ...).
        FaultToleranceError: ``torch.distributed`` not initialized, or a backend torchft cannot use.
        TorchftNotInstalledError: torchft is not installed.
    """

    def __init__(
        self,
        *,
        lighthouse: str,
        replica_id: int,
        min_replicas: int = 1,
        timeout: float = 30.0,
        quorum_timeout: float = 60.0,
        init_sync: bool = True,
        hostname: str | None = None,
    ) -> None:
        replica_id = require_int(replica_id, "ReplicaGroup replica_id", FSDPTypeError, minimum=0, range_error=FSDPError)
        min_replicas = require_int(
            min_replicas, "ReplicaGroup min_replicas", FSDPTypeError, minimum=1, range_error=FSDPError
        )
        for name, value in (("timeout", timeout), ("quorum_timeout", quorum_timeout)):
            require_real(value, f"ReplicaGroup {name} (seconds)", FSDPTypeError, positive=True, range_error=FSDPError)
        require_bool(init_sync, "ReplicaGroup init_sync", FSDPTypeError)
        require_str(
            lighthouse, "ReplicaGroup lighthouse (the lighthouse's http://host:port)", FSDPTypeError, nonempty=True
        )
        if not dist.is_initialized():
            raise FaultToleranceError(
                "ReplicaGroup: torch.distributed is not initialized. Call spmd.init_process_group('gloo') first (one "
                "torchrun per replica group; it keeps a restarted group's rendezvous apart from the dead one's), then "
                "build this, then FSDP over the group's own ranks."
            )
        manager_module = torchft_module("torchft.manager")
        host = hostname or socket.gethostname()
        self._store, store_host, store_port = _fresh_store(host)
        self.replica_id, self.min_replicas = replica_id, min_replicas
        self._cross_group = _cross_group_pg(timedelta(seconds=timeout))
        self.manager = manager_module.Manager(
            pg=self._cross_group,
            load_state_dict=None,
            state_dict=None,
            min_replica_size=min_replicas,
            timeout=timedelta(seconds=timeout),
            quorum_timeout=timedelta(seconds=quorum_timeout),
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            store_addr=store_host,
            store_port=store_port,
            lighthouse_addr=lighthouse,
            replica_id=f"fsdp_xla_replica_{replica_id}",
            hostname=host,
            init_sync=init_sync,
        )

    def describe(self) -> str:
        return f"ReplicaGroup(replica_id={self.replica_id}, min_replicas={self.min_replicas})"

    def __repr__(self) -> str:
        return self.describe()

    def all_reduce_hook(self) -> Callable[[torch.Tensor], None]:
        """Average a gradient shard over the live replica groups (a group being healed sends
        zeros, and a failed all-reduce drops the step): `average_over_live_groups`."""
        return average_over_live_groups(self.manager, self._cross_group)

    def optimizer(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> torch.optim.Optimizer:
        """``optimizer`` wrapped for healing: ``zero_grad()`` joins the step's quorum, ``step()``
        updates only when every live group's step committed. ``model`` and ``optimizer`` become
        the state a replacement group fetches from this one (rank to rank, own shards only).
        Call it after FSDP and before the first step."""
        optim_module = torchft_module("torchft.optim")
        shards = ShardState(model, optimizer)  # now, outside a step: see fsdp_xla.ft._state
        self.register_state("sharded_model_and_optimizer", shards.state_dict, shards.load_state_dict)
        return optim_module.OptimizerWrapper(self.manager, optimizer)

    def register_state(self, key: str, state_dict: Callable[[], Any], load_state_dict: Callable[[Any], None]) -> None:
        """More state a replacement must fetch (an LR scheduler, a data position): ``state_dict()``
        runs on the live peer, ``load_state_dict(state)`` on the replacement."""
        self.manager.register_state_dict_fn(key, load_state_dict, state_dict)

    def state_dict(self) -> dict[str, int]:
        """The group's step count and torchft's count of committed batches: save it with the
        checkpoint (``save_sharded(..., extra={"replicas": group.state_dict()})``)."""
        return {k: int(v) for k, v in self.manager.state_dict().items()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Take a checkpoint's step count back (after ``load_sharded``), before the first step.

        Our checkpoints stay the fallback: when every replica group was lost, each one resumes
        from its own last checkpoint and the quorum takes the newest step from there (the others
        heal from it); a group restarted beside a live one heals from that one as before.

        Raises:
            FSDPTypeError: not the dict `state_dict` returned.
        """
        if not isinstance(state, dict) or set(state) != {"step", "batches_committed"}:
            raise FSDPTypeError(
                f"ReplicaGroup.load_state_dict takes what ReplicaGroup.state_dict returned, a dict with 'step' and "
                f"'batches_committed', got {state!r:.80}."
            )
        for key, value in state.items():
            require_int(value, f"ReplicaGroup.load_state_dict: {key}", FSDPTypeError, minimum=0)
        self.manager.load_state_dict({k: int(v) for k, v in state.items()})

    @property
    def step(self) -> int:
        """Steps committed so far (a replacement takes its peer's count when it heals)."""
        return self.manager.current_step()

    @property
    def participants(self) -> int:
        """Replica groups taking part in this step (waits for the step's quorum)."""
        return self.manager.num_participants()

    def is_participating(self) -> bool:
        """Whether this group's gradients count this step (not while it is being healed)."""
        return self.manager.is_participating()

    def shutdown(self) -> None:
        """Stop this rank's manager and checkpoint server."""
        self.manager.shutdown(wait=False)
