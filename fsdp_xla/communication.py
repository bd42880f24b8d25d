"""Every collective of an FSDP step, attributed to its unit and phase, against ZeRO-3's minimum.

ZeRO-3 moves each parameter three times a step: gathered for the forward, gathered again for
the backward, and its gradient reduce-scattered back to the shards. With ``P`` bytes of
parameters on ``N`` devices, ring algorithms send ``3 P (N - 1) / N`` bytes per device
(`zero3_minimum_bytes`). An all-reduce followed by a slice, in place of a reduce-scatter, sends
twice a reduce-scatter's bytes: XLA's CPU compiler reduces GSPMD's gradients that way (it has no
pass that turns them into reduce-scatters; the TPU and GPU compilers do), see docs/fsdp.md.

`attribute` reads the compiled graphs that `spmd.inspector` captured. The runtime traces each
unit's forward gather, backward regather and gradient reduction inside a scope naming the unit
and phase (`fsdp_xla._phases`). A gather carries its scope itself. A gradient's reduction is
placed by GSPMD at the op that computed the gradient (a matmul that autograd traced outside any
unit's scope), so it takes the scope of the nearest instructions that read it: the reduction to
the stored layout. On the dtensor backend, `dtensor_traffic_mode` records the same from
torch.distributed's own ``CommDebugMode``.

    with spmd.inspector.capture() as cap:
        loss_fn(model(x)).backward(); optimizer.step(); torch_xla.sync()
    records = attribute(cap.report.graphs)
    counts_by_unit(records)["h.0"][Phase.GRADIENT_REDUCTION]   # {CollectiveKind.ALL_REDUCE: 14}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fsdp_xla._phases import SCOPE_PREFIX, CollectiveRecord, Phase, parse_scope
from spmd.hlo import HloModuleText, Instruction, annotation_scopes
from spmd.inspector import CollectiveKind, GraphReport

__all__ = [
    "Phase",
    "CollectiveRecord",
    "attribute",
    "counts_by_unit",
    "bytes_by_phase",
    "dtensor_traffic_mode",
    "zero3_minimum_bytes",
]


def _phase_of(op_names: Iterable[str]) -> tuple[Phase, str | None]:
    """The innermost FSDP scope among ``op_names`` (the first that has one)."""
    for op_name in op_names:
        for scope in reversed(annotation_scopes(op_name, SCOPE_PREFIX)):
            parsed = parse_scope(scope)
            if parsed is not None:
                return parsed
    return Phase.OTHER, None


_MAX_DEPTH = 8


def _elements(inst: Instruction) -> int:
    return sum(a.elements for a in inst.arrays)


def _op_name(module: HloModuleText, inst: Instruction) -> str:
    """``inst``'s ``op_name``; for a ``call`` or ``fusion`` without one (XLA:CPU's parallel-task
    calls), its computation root's."""
    name = inst.metadata.get("op_name", "")
    if name or inst.opcode not in ("call", "fusion"):
        return name
    called = (inst.attribute("to_apply") or inst.attribute("calls") or "").lstrip("%")
    root = next((i for i in module.computations.get(called, []) if i.is_root), None)
    return _op_name(module, root) if root is not None else ""


def _reduction_phase(module: HloModuleText, inst: Instruction) -> tuple[Phase, str | None]:
    """The FSDP scope of the nearest readers of ``inst``'s value, followed only through readers
    that do not grow it: a gradient reaches the slice to its stored layout through transposes,
    copies and the sum of a tied weight's gradients. A value that feeds larger tensors (the
    loss's normalizer feeding the logits' gradient) is not a gradient being reduced."""
    limit = _elements(inst)
    frontier, seen = [inst], {inst.name}
    for _ in range(_MAX_DEPTH):
        readers = [u for n in frontier for u in module.users.get(n.name, []) if u.name not in seen]
        readers = [u for u in readers if _elements(u) <= limit]
        seen.update(u.name for u in readers)
        for reader in readers:
            phase, unit = _phase_of([_op_name(module, reader)])
            if unit is not None:
                return phase, unit
        frontier = readers
    return Phase.OTHER, None


def attribute(graphs: Iterable[GraphReport]) -> list[CollectiveRecord]:
    """Every collective of ``graphs`` (a step's compiled graphs), in graph and schedule order,
    with its unit and phase. Reads each graph's optimized HLO file again for the users of
    each collective."""
    records = []
    for graph in graphs:
        if not graph.collectives:
            continue
        module = HloModuleText.parse(Path(graph.hlo_path).read_text())
        for c in graph.collectives:
            phase, unit = _phase_of([c.op_name])
            if unit is None and c.name in module.by_name:
                phase, unit = _reduction_phase(module, module.by_name[c.name])
            records.append(
                CollectiveRecord(
                    graph=graph.name,
                    name=c.name,
                    kind=c.kind,
                    shape=c.shape,
                    bytes_sent_per_device=c.bytes_sent_per_device,
                    replica_groups=c.replica_groups,
                    phase=phase,
                    unit=unit,
                    where=c.where,
                )
            )
    return records


def counts_by_unit(records: Iterable[CollectiveRecord]) -> dict[str | None, dict[Phase, Counter[CollectiveKind]]]:
    """``{unit: {phase: {kind: count}}}`` (unit ``None`` holds `Phase.OTHER`)."""
    out: dict[str | None, dict[Phase, Counter[CollectiveKind]]] = {}
    for r in records:
        out.setdefault(r.unit, {}).setdefault(r.phase, Counter())[r.kind] += 1
    return out


def bytes_by_phase(records: Iterable[CollectiveRecord]) -> dict[Phase, int]:
    """Bytes each device sends per phase, every phase present (0 when it sends nothing)."""
    out = dict.fromkeys(Phase, 0)
    for r in records:
        out[r.phase] += r.bytes_sent_per_device
    return out


def dtensor_traffic_mode() -> Any:
    """A ``torch.distributed.tensor.debug.CommDebugMode`` whose ``records`` list holds a
    `CollectiveRecord` per collective run inside it (the dtensor backend; see
    `fsdp_xla._dtensor_traffic`)::

        with dtensor_traffic_mode() as mode:
            loss_fn(model(x)).backward(); optimizer.step()
        bytes_by_phase(mode.records)
    """
    from fsdp_xla._dtensor_traffic import TrafficMode

    return TrafficMode()


def zero3_minimum_bytes(param_bytes: int, devices: int) -> int:
    """ZeRO-3's bytes sent per device per step with ring collectives: gather in forward, gather
    again in backward, reduce-scatter the gradients, each ``param_bytes (N - 1) / N``."""
    return 3 * param_bytes * (devices - 1) // devices
