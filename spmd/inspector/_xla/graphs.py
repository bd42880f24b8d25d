"""A compiled graph of the torch_xla backend, as the report holds it: its memory (XLA's buffer
assignment), arguments and collectives per device; its JSON entry and its part of the table.

Values only (frozen dataclasses); reading them from XLA's dumps is `spmd.inspector._xla.dump`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from spmd._util.memory import MemoryUsage, format_bytes
from spmd.hlo import ArrayShape
from spmd.inspector.collectives import Collective, CollectiveKind

__all__ = ["GraphReport", "ParameterInfo"]


@dataclass(frozen=True)
class ParameterInfo:
    """One argument of a compiled graph (a weight, optimizer state, an input batch...).

    Attributes:
        number: the entry parameter number.
        shape: the per-device (partitioned) shape.
        global_shape: the unpartitioned shape, when the pre-partitioning HLO was dumped.
        sharding: the HLO sharding text (``{replicated}``, ``{devices=[8,1]...}``).
        name: the tensor's name when it could be told (module path + parameter name), else ''.
    """

    number: int
    shape: ArrayShape
    global_shape: ArrayShape | None
    sharding: str
    name: str = ""

    @property
    def nbytes(self) -> int:
        """Bytes on each device."""
        return self.shape.nbytes

    @property
    def global_nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return (self.global_shape or self.shape).nbytes

    @property
    def label(self) -> str:
        """``'blocks.0.attn.qkv.weight (parameter 3)'`` or ``'parameter 3'``."""
        return f"{self.name} (parameter {self.number})" if self.name else f"parameter {self.number}"


@dataclass(frozen=True)
class GraphReport:
    """What one compiled graph costs each device.

    Attributes:
        name: XLA's module name, e.g. ``SyncTensorsGraph.412``.
        module_id: the dump's module number (compile order within the process).
        num_partitions: devices the graph runs on.
        memory: per-device memory from XLA's buffer assignment; ``None`` if the backend did
            not write one.
        parameters: the graph's arguments, by parameter number.
        collectives: the collectives in schedule order.
        hlo_path: the partitioned, optimized HLO text file.
        step: the step (count of ``torch_xla.sync()`` calls before it) that compiled it.
    """

    name: str
    module_id: int
    num_partitions: int
    memory: MemoryUsage | None
    parameters: tuple[ParameterInfo, ...]
    collectives: tuple[Collective, ...]
    hlo_path: str
    step: int | None = None

    @property
    def argument_bytes(self) -> int:
        """Bytes of all arguments on each device (from the partitioned parameter shapes)."""
        return sum(p.nbytes for p in self.parameters)

    @property
    def bytes_sent_per_device(self) -> int:
        """Ring-algorithm bytes each device sends in this graph, all collectives together."""
        return sum(c.bytes_sent_per_device for c in self.collectives)

    def count(self, kind: CollectiveKind) -> int:
        """How many collectives of ``kind`` the graph runs."""
        return sum(1 for c in self.collectives if c.kind is kind)

    def parameter(self, number: int) -> ParameterInfo | None:
        """The argument with parameter number ``number``."""
        return next((p for p in self.parameters if p.number == number), None)

    def to_dict(self) -> dict[str, Any]:
        """The graph's entry in the report's JSON ``graphs``."""
        memory = self.memory
        return {
            "name": self.name,
            "module_id": self.module_id,
            "step": self.step,
            "num_partitions": self.num_partitions,
            "memory_per_device": None
            if memory is None
            else {
                "peak_bytes": memory.peak_bytes,
                "argument_bytes": memory.argument_bytes,
                "output_bytes": memory.output_bytes,
                "alias_bytes": memory.alias_bytes,
                "temp_bytes": memory.temp_bytes,
            },
            "argument_bytes_per_device": self.argument_bytes,
            "parameters": [
                {
                    "number": p.number,
                    "name": p.name,
                    "shape": str(p.shape),
                    "global_shape": None if p.global_shape is None else str(p.global_shape),
                    "sharding": p.sharding,
                    "bytes_per_device": p.nbytes,
                }
                for p in self.parameters
            ],
            "collectives": [self._collective_dict(c) for c in self.collectives],
            "totals": {
                "collectives": dict(sorted(Counter(c.kind.value for c in self.collectives).items())),
                "bytes_sent_per_device": self.bytes_sent_per_device,
            },
            "hlo_file": self.hlo_path,
        }

    def _collective_dict(self, c: Collective) -> dict[str, Any]:
        return {
            "op": c.kind.value,
            "name": c.name,
            "shape": c.shape,
            "dtype": sorted({a.dtype for a in c.arrays}),
            "result_bytes": c.result_bytes,
            "group_size": c.group_size,
            "num_groups": c.num_groups,
            "dimensions": list(c.dimensions),
            "bytes_sent_per_device": c.bytes_sent_per_device,
            "op_type": c.op_type,
            "op_name": c.op_name,
            "source": c.source,
            "source_parameter": c.source_parameter,
            "scope": c.scope,
            "source_tensor": self.source_tensor(c),
        }

    def source_tensor(self, c: Collective) -> str:
        """The parameter the collective moves, if its input is one, else ''."""
        if c.source_parameter is not None:
            p = self.parameter(c.source_parameter)
            if p is not None:
                return p.label
        return ""

    def table_lines(self, max_collectives: int) -> list[str]:
        """The graph's part of the report's table: memory, arguments, the largest collectives."""
        lines: list[str] = []
        step = f", step {self.step}" if self.step is not None else ""
        lines.append("")
        lines.append(f"== {self.name} (module {self.module_id}{step}) ==")
        if self.memory is not None:
            m = self.memory
            lines.append(
                f"  per-device peak {format_bytes(m.peak_bytes)} = arguments {format_bytes(m.argument_bytes)}"
                f" + outputs {format_bytes(m.output_bytes)} + temporaries {format_bytes(m.temp_bytes)}"
            )
        else:
            lines.append("  per-device peak: not reported by this backend (no buffer assignment dump)")
        lines.append(
            f"  arguments per device: {format_bytes(self.argument_bytes)} in {len(self.parameters)} parameter(s)"
        )
        if not self.collectives:
            lines.append("  collectives: none")
            return lines
        lines.append(
            f"  collectives: {len(self.collectives)}, each device sends {format_bytes(self.bytes_sent_per_device)}"
            + (f"; the {max_collectives} largest:" if len(self.collectives) > max_collectives else ":")
        )
        header = f"    {'op':<19}{'shape':<26}{'group':>6}{'sent/device':>14}  source"
        lines.append(header)
        largest = sorted(self.collectives, key=lambda c: (-c.bytes_sent_per_device, c.position))
        for c in largest[:max_collectives]:
            lines.append(
                f"    {c.kind.value:<19}{c.shape:<26}{c.group_size:>6}"
                f"{format_bytes(c.bytes_sent_per_device):>14}  {self.source_tensor(c) or c.where}"
            )
        if len(self.collectives) > max_collectives:
            lines.append(f"    ... {len(self.collectives) - max_collectives} more (see the JSON)")
        return lines
