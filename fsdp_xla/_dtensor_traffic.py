"""The collectives a step runs on the dtensor backend, as torch.distributed's ``CommDebugMode``
sees them, in the records of `fsdp_xla.communication`.

``CommDebugMode`` is torch's own accounting: a dispatch mode that sees every c10d collective
(FSDP2's flat all-gathers and reduce-scatters) and functional collective (DTensor's
redistributions), and a module tracker that knows whether backward is running. It counts calls;
`TrafficMode` adds, per call, the bytes a rank sends (ring algorithm, as the inspector counts
them on GSPMD) and the group's ranks.

Phases come from the kind and the tracker: an all-gather in forward is a forward gather, one in
backward a backward gather, a reduce-scatter a gradient reduction, and so is an all-reduce in
backward (HSDP's reduction of the shards over the replicate dim, which FSDP2 runs right after
the reduce-scatter); the rest is `Phase.OTHER` (a loss averaged over the ranks, the optimizer's). Units
are not named: in backward FSDP2 prefetches the next unit's all-gather inside the hooks of the
unit before it, so the tracker's module is not the unit gathered; ``where`` keeps the module the
tracker was in.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode

from fsdp_xla._phases import CollectiveRecord, Phase
from spmd.inspector.collectives import CollectiveKind, ring_bytes_sent
from spmd.torch_compat import tree_leaves

__all__ = ["TrafficMode"]

_KINDS = {
    # c10d ops (FSDP2, torch.distributed calls): the results are the first argument.
    "_allgather_base_": CollectiveKind.ALL_GATHER,
    "allgather_into_tensor_coalesced_": CollectiveKind.ALL_GATHER,
    "_reduce_scatter_base_": CollectiveKind.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced_": CollectiveKind.REDUCE_SCATTER,
    "allreduce_": CollectiveKind.ALL_REDUCE,
    "allreduce_coalesced_": CollectiveKind.ALL_REDUCE,
    "alltoall_base_": CollectiveKind.ALL_TO_ALL,
    # functional collectives (DTensor): the results are returned.
    "all_gather_into_tensor": CollectiveKind.ALL_GATHER,
    "all_gather_into_tensor_coalesced": CollectiveKind.ALL_GATHER,
    "reduce_scatter_tensor": CollectiveKind.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": CollectiveKind.REDUCE_SCATTER,
    "all_reduce": CollectiveKind.ALL_REDUCE,
    "all_reduce_coalesced": CollectiveKind.ALL_REDUCE,
    "all_to_all_single": CollectiveKind.ALL_TO_ALL,
}


def _group_ranks(args: tuple) -> tuple[int, ...]:
    """The ranks of the collective's group: a c10d op's ProcessGroup argument, or a functional
    collective's group name (its last string argument); the world when neither is found."""
    for a in args:
        if isinstance(a, torch.ScriptObject) and a._type().qualified_name().endswith(".ProcessGroup"):
            group = dist.ProcessGroup.unbox(a)
            return tuple(dist.get_process_group_ranks(group))
    names = [a for a in args if isinstance(a, str)]
    if names:
        from spmd.torch_compat import resolve_process_group as _resolve_process_group

        return tuple(dist.get_process_group_ranks(_resolve_process_group(names[-1])))
    return tuple(range(dist.get_world_size()))


def _phase(kind: CollectiveKind, backward: bool) -> Phase:
    if kind is CollectiveKind.ALL_GATHER:
        return Phase.BACKWARD_GATHER if backward else Phase.FORWARD_GATHER
    if kind is CollectiveKind.REDUCE_SCATTER or (kind is CollectiveKind.ALL_REDUCE and backward):
        return Phase.GRADIENT_REDUCTION
    return Phase.OTHER


class TrafficMode(CommDebugMode):
    """``CommDebugMode`` that also keeps a `CollectiveRecord` per collective, in ``records``
    (this rank's view; ``graph`` is ``'rank <r>'``)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[CollectiveRecord] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        packet = getattr(func, "_overloadpacket", None)
        kind = _KINDS.get(getattr(packet, "__name__", ""))
        if kind is None or out is NotImplemented:
            return out
        functional = "_c10d_functional" in str(packet)
        results = [t for t in tree_leaves(out if functional else args[0]) if isinstance(t, torch.Tensor)]
        ranks = _group_ranks(args)
        result_bytes = sum(t.numel() * t.element_size() for t in results)
        tracker = self.advanced_module_tracker
        self.records.append(
            CollectiveRecord(
                graph=f"rank {dist.get_rank()}",
                name=str(func),
                kind=kind,
                shape=", ".join(f"{t.dtype}{list(t.shape)}".replace("torch.", "") for t in results),
                bytes_sent_per_device=ring_bytes_sent(kind, result_bytes, len(ranks)),
                replica_groups=(ranks,),
                phase=_phase(kind, tracker.is_bw),
                unit=None,
                where=tracker.name,
            )
        )
        return out
