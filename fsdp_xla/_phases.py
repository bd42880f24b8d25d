"""The phases of an FSDP step, the XLA scopes that label what each unit traces in them, and
`CollectiveRecord` (one collective with its unit and phase), which both readers return.

The runtime opens a scope ``fsdp__<phase>__<unit path>`` around what it traces for a unit: the
forward gather, the backward regather, the reduction of the gradients. torch_xla writes the
scope into the ``op_name`` of every HLO instruction traced inside it (``XLA_HLO_DEBUG=1``), so a
collective in the compiled graph can be traced back to its unit and phase
(`fsdp_xla.communication`). The scopes cost nothing at run time: metadata only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from spmd.inspector import CollectiveKind

__all__ = ["Phase", "SCOPE_PREFIX", "scope_name", "parse_scope", "CollectiveRecord"]

SCOPE_PREFIX = "fsdp__"
"""How every FSDP scope name starts (torch_xla turns ``:`` in a scope name into ``_``)."""


class Phase(enum.Enum):
    """What a collective of an FSDP step is for."""

    FORWARD_GATHER = "forward-gather"
    """A unit's parameters gathered for its forward."""
    BACKWARD_GATHER = "backward-gather"
    """A unit's parameters gathered again for its backward (ZeRO-3)."""
    GRADIENT_REDUCTION = "gradient-reduction"
    """A unit's gradients reduced across devices to the sharded layout."""
    OTHER = "other"
    """Not FSDP's: the loss's reduction, resharding the model's own code asks for, the optimizer's."""


def scope_name(phase: Phase, unit: str) -> str:
    """``fsdp__forward-gather__h.0`` (``unit`` is the unit's path, ``''`` for the root)."""
    return f"{SCOPE_PREFIX}{phase.value}__{unit}"


def parse_scope(scope: str) -> tuple[Phase, str] | None:
    """``(phase, unit path)`` of a scope `scope_name` wrote, ``None`` for any other scope."""
    if not scope.startswith(SCOPE_PREFIX):
        return None
    phase, sep, unit = scope[len(SCOPE_PREFIX) :].partition("__")
    if not sep:
        return None
    try:
        return Phase(phase), unit
    except ValueError:
        return None


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective of a compiled step, with the FSDP unit and phase it belongs to.

    Attributes:
        graph: the compiled graph (HLO module) it runs in.
        name: its HLO instruction name.
        kind: all-gather, all-reduce, reduce-scatter, ...
        shape: the per-device result shape, e.g. ``f32[2048,512]``.
        bytes_sent_per_device: ring-algorithm bytes one device sends for it.
        replica_groups: the device ids of each group that runs it.
        phase: what it is for (`Phase.OTHER` when no FSDP scope names it).
        unit: the unit's path (``''`` for the root); ``None`` for `Phase.OTHER`, and on the
            dtensor backend, where the module tracker cannot tell it (`TrafficMode`).
        where: the op it came from (``aten__nll_loss at torch/nn/functional.py:3458``).
    """

    graph: str
    name: str
    kind: CollectiveKind
    shape: str
    bytes_sent_per_device: int
    replica_groups: tuple[tuple[int, ...], ...]
    phase: Phase
    unit: str | None
    where: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (kind and phase as their string values)."""
        return {
            "graph": self.graph,
            "name": self.name,
            "kind": self.kind.value,
            "shape": self.shape,
            "bytes_sent_per_device": self.bytes_sent_per_device,
            "replica_groups": [list(g) for g in self.replica_groups],
            "phase": self.phase.value,
            "unit": self.unit,
            "where": self.where,
        }
