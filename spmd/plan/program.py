"""What one compiled step does, read from the TPU compiler's optimized HLO (pure Python).

The planner's program runs its layers as a loop, so a collective inside the loop body runs once
per layer: `step_collectives` walks the call graph from the entry computation and multiplies by
each ``while`` loop's trip count (the constant its condition compares against). The TPU compiler
also splits one collective over several fusions (async and collective-matmul pieces share a
``channel_id``): those count once per loop iteration. A reduce-scatter shows up as a fusion
calling ``all-reduce-scatter``: it is counted as a reduce-scatter of the fusion's result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spmd.inspector.collectives import CollectiveKind, parse_replica_groups, ring_bytes_sent
from spmd.inspector.hlo_text import HloModuleText, Instruction, parse_shape

__all__ = ["StepCollective", "step_collectives", "trip_count"]

_KINDS = {k.value: k for k in CollectiveKind}
_KINDS.update({f"{k.value}-start": k for k in CollectiveKind})


@dataclass(frozen=True)
class StepCollective:
    """A collective as one device runs it over a whole step.

    Attributes:
        kind: all-gather, all-reduce, reduce-scatter, all-to-all or collective-permute.
        name: the HLO instruction (or reduce-scatter fusion) name.
        result_bytes: per-device result bytes of one execution.
        group_size: devices in each replica group.
        count: executions per step (the trip counts of the loops around it).
        bytes_sent_per_device: ring-algorithm bytes one device sends per step (all executions).
        op_name: the JAX/torch op it came from (HLO metadata).
        group: the first replica group's device ids (which devices talk).
        implements: for an all-reduce whose every operand is a shard written into zeros
            (``dynamic-update-slice``), ``"all-gather"``: the TPU compiler's way of gathering on
            some topologies (v5p). Empty otherwise.
        over_dcn: a collective between slices. libtpu compiles one slice's program, whose
            replica groups stay inside the slice; what crosses slices is a host-transfer
            ``send`` to the multi-slice runtime (``_xla_megascale_transfer_type``), whose group is
            the slices.
    """

    kind: CollectiveKind
    name: str
    result_bytes: int
    group_size: int
    count: int
    bytes_sent_per_device: int
    op_name: str
    group: tuple[int, ...] = ()
    implements: str = ""
    over_dcn: bool = False


def trip_count(hlo_text: str, module: HloModuleText, condition: str) -> int:
    """The trip count of a counted loop whose condition is ``i < constant``; 1 if unknown."""
    insts = module.computations.get(condition.lstrip("%"), [])
    for inst in insts:
        if inst.opcode == "compare" and inst.attribute("direction") == "LT":
            for operand in inst.operands:
                m = re.search(rf"%{re.escape(operand)} = s32\[\]\S* constant\((\d+)\)", hlo_text)
                if m:
                    return int(m.group(1))
    return 1


_DCN_KINDS = {
    "ALL_REDUCE": CollectiveKind.ALL_REDUCE,
    "ALL_GATHER": CollectiveKind.ALL_GATHER,
    "REDUCE_SCATTER": CollectiveKind.REDUCE_SCATTER,
    "ALL_TO_ALL": CollectiveKind.ALL_TO_ALL,
}


def _dcn_transfer(inst: Instruction) -> tuple[CollectiveKind, int] | None:
    """(kind, slices) of a multi-slice ``send``, e.g. ``_xla_megascale_target="{1,2}x{0:3}"``:
    slices 1 and 2 (1-based), devices 0..3 of each."""
    if inst.opcode != "send":
        return None
    kind = re.search(r'_xla_megascale_transfer_type="(\w+)"', inst.attributes)
    target = re.search(r'_xla_megascale_target="\{([\d,:]+)\}', inst.attributes)
    if kind is None or kind.group(1) not in _DCN_KINDS:
        return None
    slices = 2
    if target is not None:
        slices = 0
        for part in target.group(1).split(","):
            lo, _, hi = part.partition(":")
            slices += int(hi) - int(lo) + 1 if hi else 1
    return _DCN_KINDS[kind.group(1)], slices


def _called(inst: Instruction) -> list[str]:
    names = []
    for key in ("calls", "to_apply", "body", "branch_computations"):
        value = inst.attribute(key)
        if value:
            names += [n.strip().lstrip("%") for n in value.strip("{}").split(",") if n.strip()]
    return names


def step_collectives(hlo_text: str) -> list[StepCollective]:
    """Every collective one device runs in a step of the optimized HLO module ``hlo_text``
    (``compiled.as_text()``), loops unrolled by count."""
    module = HloModuleText.parse(hlo_text)
    num_devices = module.num_partitions
    by_name = {i.name: i for insts in module.computations.values() for i in insts}

    def writes_shard_into_zeros(name: str) -> bool:
        inst = by_name.get(name)
        while inst is not None and inst.opcode in ("copy", "bitcast", "copy-done"):
            inst = by_name.get(inst.operands[0]) if inst.operands else None
        if inst is None:
            return False
        if inst.opcode == "fusion":
            fused = module.computations.get((inst.attribute("calls") or "").lstrip("%"), [])
            return any(i.is_root and i.opcode == "dynamic-update-slice" for i in fused)
        return inst.opcode == "dynamic-update-slice"

    seen: dict[tuple[int, str], StepCollective] = {}
    order: list[tuple[int, str]] = []

    def record(key: tuple[int, str], item: StepCollective) -> None:
        if key not in seen:
            seen[key] = item
            order.append(key)

    def walk(computation: str, multiplier: int, context: int) -> None:
        for inst in module.computations.get(computation, []):
            if inst.opcode == "while":
                body = inst.attribute("body") or ""
                count = trip_count(hlo_text, module, inst.attribute("condition") or "")
                walk(body.lstrip("%"), multiplier * count, id(inst))
                continue
            calls = inst.attribute("calls") or ""
            if inst.opcode == "fusion" and "all-reduce-scatter" in calls:
                inner = [i for i in module.computations.get(calls.lstrip("%"), []) if i.opcode == "all-reduce"]
                groups = parse_replica_groups(inner[0].attribute("replica_groups") if inner else None, num_devices)
                size = sum(a.nbytes for a in parse_shape(inst.shape_text))
                channel = (inner[0].attribute("channel_id") if inner else None) or inst.name
                record(
                    (context, f"rs:{channel}"),
                    StepCollective(
                        CollectiveKind.REDUCE_SCATTER,
                        inst.name,
                        size,
                        len(groups[0]),
                        multiplier,
                        ring_bytes_sent(CollectiveKind.REDUCE_SCATTER, size, len(groups[0])),
                        inst.metadata.get("op_name", ""),
                        tuple(groups[0]),
                    ),
                )
                continue
            dcn = _dcn_transfer(inst)
            if dcn is not None:
                kind, slices = dcn
                size = parse_shape(inst.shape_text)[0].nbytes  # (data, context, token)
                record(
                    (context, f"dcn:{inst.attribute('channel_id') or inst.name}"),
                    StepCollective(
                        kind,
                        inst.name,
                        size,
                        slices,
                        multiplier,
                        ring_bytes_sent(kind, size, slices),
                        inst.metadata.get("op_name", ""),
                        over_dcn=True,
                    ),
                )
                continue
            kind = _KINDS.get(inst.opcode)
            if kind is not None:
                arrays = parse_shape(inst.shape_text)
                if inst.opcode.endswith("-start") and len(arrays) > 1:
                    arrays = arrays[len(arrays) // 2 :]  # (operands, results) tuple of an async start
                size = sum(a.nbytes for a in arrays)
                if kind is CollectiveKind.COLLECTIVE_PERMUTE:
                    group, members = 2, ()
                    sent = size
                else:
                    groups = parse_replica_groups(inst.attribute("replica_groups"), num_devices)
                    group, members = len(groups[0]), tuple(groups[0])
                    sent = ring_bytes_sent(kind, size, group)
                channel = inst.attribute("channel_id") or inst.name
                gathers = (
                    kind is CollectiveKind.ALL_REDUCE
                    and bool(inst.operands)
                    and all(writes_shard_into_zeros(o) for o in inst.operands)
                )
                record(
                    (context, f"{kind.value}:{channel}"),
                    StepCollective(
                        kind,
                        inst.name,
                        size,
                        group,
                        multiplier,
                        sent,
                        inst.metadata.get("op_name", ""),
                        members,
                        "all-gather" if gathers else "",
                    ),
                )
                continue
            for callee in _called(inst):
                if callee in module.computations and callee != computation:
                    walk(callee, multiplier, context)

    walk(module.entry, 1, 0)
    out = []
    for key in order:
        c = seen[key]
        out.append(
            StepCollective(
                c.kind,
                c.name,
                c.result_bytes,
                c.group_size,
                c.count,
                c.bytes_sent_per_device * c.count,
                c.op_name,
                c.group,
                c.implements,
                c.over_dcn,
            )
        )
    return out
