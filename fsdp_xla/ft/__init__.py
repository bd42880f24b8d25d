"""Healing HSDP (torchft): replica groups that keep training when one of them is lost.

Each replica group is one torchrun job (or one per host). FSDP shards over the group's own
ranks; the gradients are all-reduced across the replica groups alive at each step by torchft's
managed process group (`ReplicaGroup`, given to FSDP as ``replicate_axis``); a lighthouse
(`Lighthouse`, or ``python -m fsdp_xla.ft lighthouse``) tracks the groups by heartbeat. When a
rank dies, torchrun restarts its group (``--max-restarts``), and the new group fetches the
weights and optimizer state from a live peer, while the other groups go on training. Off unless
used; torchft is the optional extra ``xla-spmd[ft]``. The current lane only (docs/reliability.md).

    spmd.init_process_group("gloo")      # this group's ranks (a restart gets a rendezvous of its own)
    group = ft.ReplicaGroup(lighthouse=address, replica_id=i)
    model = FSDP(model, mesh=ParallelDims(fsdp=n).mesh(), replicate_axis=group, ...)
    optimizer = group.optimizer(torch.optim.AdamW(model.parameters()), model)
    while group.step < steps:            # a replacement takes a live group's step when it heals
        optimizer.zero_grad()            # joins this step's quorum
        loss_fn(model(batch(group.step))).backward()  # reduce-scatter in the group, all-reduce across
        optimizer.step()                 # only if the step committed everywhere
"""

from fsdp_xla.errors import FaultToleranceError, TorchftNotInstalledError
from fsdp_xla.ft._group import ReplicaGroup
from fsdp_xla.ft._launch import launch_groups
from fsdp_xla.ft._lighthouse import Lighthouse

__all__ = ["FaultToleranceError", "Lighthouse", "ReplicaGroup", "TorchftNotInstalledError", "launch_groups"]
