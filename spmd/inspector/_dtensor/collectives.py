"""One collective call as a rank issues it on torch.distributed: which op, over which ranks, how
many bytes go in and come out, read from the dispatcher's arguments (the same whether the process
group is gloo, NCCL or the fake group of a dry run).

Both kinds of collective reach the dispatcher: the in-place ``c10d`` ops FSDP2 and
``torch.distributed.all_reduce`` issue, with a ``ProcessGroup`` argument, and the functional
``_c10d_functional`` ops DTensor's redistribution issues, with a group name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from spmd.inspector.collectives import CollectiveKind, ring_bytes_sent

__all__ = ["CollectiveCall", "collective_call", "group_of", "is_collective"]

# c10d op name -> the kind the torch_xla backend's report uses (CollectiveKind values), so both
# backends' JSON name a collective alike; the ones GSPMD never emits keep a name of their own.
_KINDS = {
    "_allgather_base_": "all-gather",
    "allgather_": "all-gather",
    "allgather_coalesced_": "all-gather",
    "allgather_into_tensor_coalesced_": "all-gather",
    "all_gather_into_tensor": "all-gather",
    "all_gather_into_tensor_coalesced": "all-gather",
    "_reduce_scatter_base_": "reduce-scatter",
    "reduce_scatter_": "reduce-scatter",
    "reduce_scatter_tensor_coalesced_": "reduce-scatter",
    "reduce_scatter_tensor": "reduce-scatter",
    "reduce_scatter_tensor_coalesced": "reduce-scatter",
    "allreduce_": "all-reduce",
    "allreduce_coalesced_": "all-reduce",
    "all_reduce": "all-reduce",
    "all_reduce_coalesced": "all-reduce",
    "alltoall_": "all-to-all",
    "alltoall_base_": "all-to-all",
    "all_to_all_single": "all-to-all",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "send": "send",
    "recv_": "recv",
}
_NAMESPACES = ("c10d", "_c10d_functional")
_INPUTS = ("input_tensor", "input_tensors", "inputs", "input")
_OUTPUTS = ("output_tensor", "output_tensors", "outputs", "output")
_IN_PLACE = ("tensors",)  # allreduce_, broadcast_: the same tensors in and out


@dataclass(frozen=True)
class CollectiveCall:
    """One collective a rank issued, in issue order.

    Attributes:
        position: its index among the step's collectives.
        op: the kind (``all-gather``, ``reduce-scatter``, ``all-reduce``, ``broadcast``...).
        torch_op: the dispatcher op (``c10d._allgather_base_``).
        ranks: the global ranks of its group, in group order.
        bytes_in: bytes of this rank's input tensors.
        bytes_out: bytes of this rank's output tensors.
        dtype: the input's dtype (``float32``).
        phase: ``forward``, ``backward``, ``optimizer`` or ``other``.
        module: the innermost module running when it was issued ('' outside any).
        group: its process group's name (torch numbers groups in the order a job makes them, the
            same on every rank): two groups over the same ranks are two communicators, and a
            collective on one never meets one on the other.
    """

    position: int
    op: str
    torch_op: str
    ranks: tuple[int, ...]
    bytes_in: int
    bytes_out: int
    dtype: str
    phase: str
    module: str
    group: str = ""

    @property
    def bytes_sent(self) -> int:
        """Ring-algorithm bytes the rank sends for the call (as the torch_xla backend counts them);
        for a broadcast, send...: what the rank puts in."""
        try:
            kind = CollectiveKind(self.op)
        except ValueError:
            return self.bytes_in if len(self.ranks) > 1 else 0
        return ring_bytes_sent(kind, self.bytes_out, len(self.ranks))

    def to_dict(self) -> dict[str, Any]:
        """The call's entry in a step's JSON ``collectives``."""
        return {
            "op": self.op,
            "torch_op": self.torch_op,
            "ranks": list(self.ranks),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "dtype": self.dtype,
            "phase": self.phase,
            "module": self.module,
            "bytes_sent": self.bytes_sent,
        }

    def key(self) -> tuple[Any, ...]:
        """What must match between a dry run and a real run of the same step."""
        return (self.op, self.ranks, self.bytes_in, self.bytes_out, self.dtype, self.phase, self.module)


def is_collective(func: Any) -> bool:
    """Whether the dispatcher op ``func`` is a collective this module reads."""
    return func.namespace in _NAMESPACES and func._schema.name.split("::")[-1] in _KINDS


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _first_dtype(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        for v in value:
            found = _first_dtype(v)
            if found:
                return found
    return ""


def group_of(named: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    """The global ranks and the name of an op's process group, from its ``process_group``
    argument (a ``ProcessGroup`` or its script object) or its ``group_name``."""
    import torch.distributed as dist

    from spmd._util.torch_compat import resolve_process_group as _resolve_process_group

    if "process_group" in named:
        group = named["process_group"]
        if isinstance(group, torch.ScriptObject):
            group = dist.ProcessGroup.unbox(group)
    else:
        group = _resolve_process_group(named["group_name"])
    return tuple(dist.get_process_group_ranks(group)), str(group.group_name)


def collective_call(func: Any, args: tuple, kwargs: dict, result: Any, *, position: int, phase: str, module: str):
    """The `CollectiveCall` for the dispatcher call ``func(*args, **kwargs) -> result``."""
    schema = func._schema
    named = {a.name: v for a, v in zip(schema.arguments, args)}
    named.update(kwargs or {})
    name = schema.name.split("::")[-1]
    inputs = next((named[k] for k in _INPUTS + _IN_PLACE if k in named), None)
    outputs = next((named[k] for k in _OUTPUTS + _IN_PLACE if k in named), None)
    if outputs is None:  # functional ops return their output
        outputs = result
    ranks, group = group_of(named)
    return CollectiveCall(
        position=position,
        op=_KINDS[name],
        torch_op=f"{func.namespace}.{name}",
        ranks=ranks,
        bytes_in=_nbytes(inputs),
        bytes_out=_nbytes(outputs),
        dtype=_first_dtype(inputs),
        phase=phase,
        module=module,
        group=group,
    )
