"""Collectives of a partitioned HLO module and what each device sends for them (pure Python).

Bytes sent follow the ring algorithm, the usual yardstick (XLA on a TPU torus uses rings per
axis): for a group of ``n`` devices and a per-device result of ``B`` bytes,

- all-gather: ``B (n - 1) / n`` (each device forwards the ``n - 1`` blocks it lacks)
- reduce-scatter: ``B (n - 1)`` (the input is ``n B``; a ring sends ``(n - 1) / n`` of it)
- all-reduce: ``2 B (n - 1) / n`` (a reduce-scatter then an all-gather)
- all-to-all: ``B (n - 1) / n``
- collective-permute: ``B`` for a device that sends to another device, else 0.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from spmd.hlo import (
    ArrayShape,
    HloModuleText,
    Instruction,
    mesh_axes_groups,
    module_scope,
    parse_replica_groups,
    parse_shape,
)

__all__ = [
    "CollectiveKind",
    "Collective",
    "module_scope",
    "short_source",
    "mesh_axes_groups",
    "parse_replica_groups",
    "ring_bytes_sent",
    "collectives_of",
]


class CollectiveKind(enum.Enum):
    """The collective operations GSPMD inserts."""

    ALL_GATHER = "all-gather"
    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    COLLECTIVE_PERMUTE = "collective-permute"


_OPCODES = {
    "all-gather": CollectiveKind.ALL_GATHER,
    "all-gather-start": CollectiveKind.ALL_GATHER,
    "all-reduce": CollectiveKind.ALL_REDUCE,
    "all-reduce-start": CollectiveKind.ALL_REDUCE,
    "reduce-scatter": CollectiveKind.REDUCE_SCATTER,
    "all-to-all": CollectiveKind.ALL_TO_ALL,
    "collective-permute": CollectiveKind.COLLECTIVE_PERMUTE,
    "collective-permute-start": CollectiveKind.COLLECTIVE_PERMUTE,
}


def short_source(source: str) -> str:
    """``'/venv/lib/python3.11/site-packages/torch/nn/functional.py:3458'`` ->
    ``'torch/nn/functional.py:3458'``; other paths keep their last two parts."""
    if "site-packages/" in source:
        return source.split("site-packages/")[-1]
    parts = source.split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else source


def ring_bytes_sent(kind: CollectiveKind, result_bytes: int, group_size: int) -> int:
    """Bytes one device sends for a collective whose per-device result is ``result_bytes``."""
    n = group_size
    if n <= 1:
        return 0
    if kind is CollectiveKind.ALL_GATHER:
        return result_bytes * (n - 1) // n
    if kind is CollectiveKind.REDUCE_SCATTER:
        return result_bytes * (n - 1)
    if kind is CollectiveKind.ALL_REDUCE:
        return 2 * result_bytes * (n - 1) // n
    if kind is CollectiveKind.ALL_TO_ALL:
        return result_bytes * (n - 1) // n
    return result_bytes


@dataclass(frozen=True)
class Collective:
    """One collective of a compiled graph, as each device runs it.

    Attributes:
        kind: all-gather, all-reduce, reduce-scatter, all-to-all or collective-permute.
        name: the HLO instruction name.
        arrays: the per-device result arrays (several for a combined collective).
        operand_arrays: the per-device input arrays.
        group_size: devices in each replica group (for a permute: devices that exchange).
        num_groups: how many groups run it side by side.
        dimensions: the gathered / scattered / exchanged dims, when the op has them.
        bytes_sent_per_device: ring-algorithm bytes one device sends (module docstring).
        op_type, op_name, source: from the HLO metadata (torch_xla op, scope, file:line).
        source_parameter: the entry parameter number whose value is the input, if it is one.
        position: index of the instruction in the entry computation's schedule.
        replica_groups: the device ids of each group (for a permute: its ``(source, target)``
            pairs).
    """

    kind: CollectiveKind
    name: str
    arrays: tuple[ArrayShape, ...]
    operand_arrays: tuple[ArrayShape, ...]
    group_size: int
    num_groups: int
    dimensions: tuple[int, ...]
    bytes_sent_per_device: int
    op_type: str = ""
    op_name: str = ""
    source: str = ""
    source_parameter: int | None = None
    position: int = -1
    replica_groups: tuple[tuple[int, ...], ...] = ()

    @property
    def result_bytes(self) -> int:
        """Bytes of the per-device result."""
        return sum(a.nbytes for a in self.arrays)

    @property
    def scope(self) -> str:
        """The innermost module path the op was traced in (``blocks.0.attn``), or ''."""
        return module_scope(self.op_name)

    @property
    def where(self) -> str:
        """A short origin: ``'blocks.0.attn: aten__mm'``, or the source line."""
        op = self.op_type or (self.op_name.split("/")[-1] if self.op_name else "")
        if self.scope:
            return f"{self.scope}: {op}"
        return f"{op} at {short_source(self.source)}" if self.source else op

    @property
    def shape(self) -> str:
        """The result shape as text, ``f32[64,16]`` or ``(f32[4], f32[8])``."""
        texts = [str(a) for a in self.arrays]
        return texts[0] if len(texts) == 1 else "(" + ", ".join(texts) + ")"


def _result_arrays(inst: Instruction, operand_arrays: tuple[ArrayShape, ...]) -> tuple[ArrayShape, ...]:
    arrays = inst.arrays
    if inst.opcode == "all-gather-start" and len(arrays) >= 2:
        # (operand, result) for one array; ((operands...), (results...)) for combined ones.
        half = len(arrays) // 2
        return arrays[half:]
    if inst.opcode == "collective-permute-start":
        return operand_arrays or arrays[:1]
    return arrays


def _source_text(meta: dict[str, str]) -> str:
    file = meta.get("source_file", "")
    line = meta.get("source_line", "")
    return f"{file}:{line}" if file else ""


def collectives_of(module: HloModuleText) -> list[Collective]:
    """Every collective of ``module``'s entry computation, in schedule order."""
    by_name = module.by_name
    num_devices = module.num_partitions
    out = []
    for position, inst in enumerate(module.entry_instructions):
        kind = _OPCODES.get(inst.opcode)
        if kind is None:
            continue
        operands = [by_name[o] for o in inst.operands if o in by_name]
        operand_arrays = tuple(a for o in operands for a in parse_shape(o.shape_text))
        arrays = _result_arrays(inst, operand_arrays)
        groups: tuple[tuple[int, ...], ...]
        if kind is CollectiveKind.COLLECTIVE_PERMUTE:
            pairs = re.findall(r"\{(\d+),(\d+)\}", inst.attribute("source_target_pairs") or "")
            senders = {int(s) for s, t in pairs if s != t}
            groups = tuple((int(s), int(t)) for s, t in pairs)
            group_size, num_groups = len({int(x) for p in pairs for x in p}), 1
            sent = sum(a.nbytes for a in arrays) if senders else 0
        else:
            groups = parse_replica_groups(inst.attribute("replica_groups"), num_devices)
            group_size, num_groups = len(groups[0]), len(groups)
            sent = ring_bytes_sent(kind, sum(a.nbytes for a in arrays), group_size)
        dims_text = inst.attribute("dimensions")
        dims = tuple(int(d) for d in re.findall(r"\d+", dims_text)) if dims_text else ()
        meta = inst.metadata
        source_param = module.source_parameter(operands[0]) if len(operands) == 1 else None
        out.append(
            Collective(
                kind=kind,
                name=inst.name,
                arrays=arrays,
                operand_arrays=operand_arrays,
                group_size=group_size,
                num_groups=num_groups,
                dimensions=dims,
                bytes_sent_per_device=sent,
                op_type=meta.get("op_type", ""),
                op_name=meta.get("op_name", ""),
                source=_source_text(meta),
                source_parameter=source_param,
                position=position,
                replica_groups=groups,
            )
        )
    return out
