"""What one compiled step does, read from the TPU compiler's optimized HLO (pure Python).

The planner's program runs its layers as a loop, so a collective inside the loop body runs once
per layer: `step_collectives` walks the call graph from the entry computation and multiplies by
each ``while`` loop's trip count (the constant its condition compares against). The TPU compiler
also splits one collective over several fusions (async and collective-matmul pieces share a
``channel_id``): those count once per loop iteration. A reduce-scatter shows up as a fusion
calling ``all-reduce-scatter``: it is counted as a reduce-scatter of the fusion's result. On
TPU7x each collective offloaded to the SparseCore is a computation of its own on the
``sparsecore`` thread, and libtpu 0.0.52 gives every one of them ``channel_id=1``: those are told
apart by instruction, not channel (by channel, a layer's K and V gathers counted as one).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from spmd.hlo import DTYPE_BYTES, HloModuleText, Instruction, parse_shape
from spmd.inspector.collectives import CollectiveKind, parse_replica_groups, ring_bytes_sent

__all__ = [
    "ASYNC_COLLECTIVE_TARGETS",
    "StepCollective",
    "async_collective_role",
    "hbm_bytes",
    "leaf_layouts",
    "shape_leaves",
    "splash_kernels",
    "step_collectives",
    "trip_count",
]

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


def trip_count(hlo_text: str, module: HloModuleText, condition: str, loop: Instruction | None = None) -> int:
    """The trip count of a counted loop whose condition is ``i < bound``, a constant of any integer
    type (the TPU compiler's windowed-einsum loops count in ``u32``); 1 if unknown. With the
    ``while`` itself (``loop``), ``i`` runs from its start (the constant its init tuple holds) by
    its step (the body's ``i + constant``): a windowed einsum counts 0, 2, 4, ... (two shards, one
    each way round the ring, per iteration); otherwise from 0 by 1."""
    insts = module.computations.get(condition.lstrip("%"), [])
    by_name = {i.name: i for i in insts}
    for inst in insts:
        if inst.opcode != "compare" or inst.attribute("direction") != "LT" or len(inst.operands) != 2:
            continue
        bound = _integer_constant(hlo_text, inst.operands[1])
        if bound is None:
            continue
        index = _tuple_index(inst, 0, by_name)
        if loop is None or index is None:
            return bound
        start, step = _counter_start_and_step(hlo_text, module, loop, index)
        return max(1, math.ceil((bound - start) / step)) if step > 0 else bound
    return 1


def _integer_constant(hlo_text: str, name: str) -> int | None:
    m = re.search(rf"%{re.escape(name)} = [su]\d+\[\]\S* constant\((-?\d+)\)", hlo_text)
    return int(m.group(1)) if m else None


def _tuple_index(inst: Instruction, k: int, by_name: dict[str, Instruction]) -> int | None:
    """Which element of the loop's tuple operand ``k`` of ``inst`` reads: ``param#i`` in the
    dump, or a ``get-tuple-element`` of the parameter."""
    if k < len(inst.operand_outputs) and inst.operand_outputs[k] is not None:
        return inst.operand_outputs[k]
    source = by_name.get(inst.operands[k]) if k < len(inst.operands) else None
    return source.argument if source is not None and source.opcode == "get-tuple-element" else None


def _counter_start_and_step(hlo_text: str, module: HloModuleText, loop: Instruction, index: int) -> tuple[int, int]:
    """(start, step) of tuple element ``index`` of ``loop``: the constant its init tuple holds
    (through copies the scheduler adds), and the constant the body adds to it; 0 and 1 unknown."""
    everywhere = module.instructions_by_name
    start, init = 0, everywhere.get(loop.operands[0]) if loop.operands else None
    if init is not None and init.opcode == "tuple" and index < len(init.operands):
        name = init.operands[index]
        while name in everywhere and everywhere[name].opcode in ("copy", "bitcast") and everywhere[name].operands:
            name = everywhere[name].operands[0]
        start = _integer_constant(hlo_text, name) or 0
    body = module.computations.get((loop.attribute("body") or "").lstrip("%"), [])
    in_body = {i.name: i for i in body}
    root = next((i for i in body if i.is_root), None)
    update = in_body.get(root.operands[index]) if root is not None and index < len(root.operands) else None
    if update is None or update.opcode != "add" or len(update.operands) != 2:
        return start, 1
    steps = [
        _integer_constant(hlo_text, o)
        for k, o in enumerate(update.operands)
        if _tuple_index(update, 1 - k, in_body) == index
    ]
    return start, next((s for s in steps if s is not None), 1)


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


class _StepWalk:
    """One walk of a module's call graph from its entry, each collective recorded once per loop
    context (module docstring)."""

    def __init__(self, hlo_text: str):
        self.text = hlo_text
        self.module = HloModuleText.parse(hlo_text)
        self.num_devices = self.module.num_partitions
        self.by_name = self.module.instructions_by_name
        # Who runs each computation that is not a loop or a reduction: a SparseCore collective's
        # operand is a parameter of its computation, the value is its caller's operand.
        self.callers = {c: i for i in self.by_name.values() for c in i.callees if i.opcode != "while"}
        self.seen: dict[tuple[int, str], StepCollective] = {}
        self.sparsecore = _sparsecore_computations(hlo_text)
        self.async_channels: set[str] = set()  # of the async collectives started (`continues_async_collective`)

    def continues_async_collective(self, inst: Instruction) -> bool:
        """``inst`` (a fusion) continues or ends one of libtpu's async collectives
        (`ASYNC_COLLECTIVE_TARGETS`): the collective inside it is the one its start set going, often
        outside the loop the continuations run in. A start records its collective's channel."""
        fused = self.module.computations.get(inst.calls, [])
        channels = {i.attribute("channel_id") for i in fused if i.opcode in _KINDS} - {None}
        role = async_collective_role(fused)
        if role == "start":
            self.async_channels |= channels
            return False
        return role == "done" or bool(channels & self.async_channels)

    def record(self, key: tuple[int, str], item: StepCollective) -> None:
        self.seen.setdefault(key, item)

    def writes_shard_into_zeros(self, name: str) -> bool:
        """``name`` is (a copy of) a ``dynamic-update-slice``: a shard written into zeros."""
        inst = self.by_name.get(name)
        for _ in range(16):  # through copies, tuples and into the caller of a parameter's computation
            if inst is not None and inst.opcode in ("copy", "bitcast", "copy-done", "get-tuple-element", "tuple"):
                inst = self.by_name.get(inst.operands[0]) if inst.operands else None
            elif inst is not None and inst.opcode == "parameter" and inst.computation in self.callers:
                caller = self.callers[inst.computation]
                k = inst.argument or 0
                inst = self.by_name.get(caller.operands[k]) if k < len(caller.operands) else None
            else:
                break
        if inst is None:
            return False
        if inst.opcode == "fusion":
            fused = self.module.computations.get(inst.calls, [])
            return any(i.is_root and i.opcode == "dynamic-update-slice" for i in fused)
        return inst.opcode == "dynamic-update-slice"

    def groups(self, inst: Instruction | None) -> tuple[tuple[int, ...], ...]:
        return parse_replica_groups(inst.attribute("replica_groups") if inst else None, self.num_devices)

    def reduce_scatter_fusion(self, inst: Instruction, multiplier: int, context: int) -> None:
        """A fusion calling ``all-reduce-scatter``: a reduce-scatter of the fusion's result."""
        calls = inst.attribute("calls") or ""
        inner = [i for i in self.module.computations.get(calls.lstrip("%"), []) if i.opcode == "all-reduce"]
        group = self.groups(inner[0] if inner else None)[0]
        size = sum(a.nbytes for a in parse_shape(inst.shape_text))
        channel = (inner[0].attribute("channel_id") if inner else None) or inst.name
        kind = CollectiveKind.REDUCE_SCATTER
        sent = ring_bytes_sent(kind, size, len(group))
        op = inst.metadata.get("op_name", "")
        self.record(
            (context, f"rs:{channel}"), StepCollective(kind, inst.name, size, len(group), multiplier, sent, op, group)
        )

    def dcn(self, inst: Instruction, found: tuple[CollectiveKind, int], multiplier: int, context: int) -> None:
        kind, slices = found
        size = parse_shape(inst.shape_text)[0].nbytes  # (data, context, token)
        sent = ring_bytes_sent(kind, size, slices)
        item = StepCollective(
            kind, inst.name, size, slices, multiplier, sent, inst.metadata.get("op_name", ""), over_dcn=True
        )
        self.record((context, f"dcn:{inst.attribute('channel_id') or inst.name}"), item)

    def collective(self, inst: Instruction, kind: CollectiveKind, multiplier: int, context: int) -> None:
        arrays = parse_shape(inst.shape_text)
        if inst.opcode.endswith("-start") and len(arrays) > 1:
            arrays = arrays[len(arrays) // 2 :]  # (operands, results) tuple of an async start
        size = sum(a.nbytes for a in arrays)
        if kind is CollectiveKind.COLLECTIVE_PERMUTE:
            group, members, sent = 2, (), size
        else:
            members = self.groups(inst)[0]
            group, sent = len(members), ring_bytes_sent(kind, size, len(members))
        gathers = kind is CollectiveKind.ALL_REDUCE and bool(inst.operands)
        gathers = gathers and all(self.writes_shard_into_zeros(o) for o in inst.operands)
        item = StepCollective(
            kind, inst.name, size, group, multiplier, sent, inst.metadata.get("op_name", ""), members,
            "all-gather" if gathers else "",
        )  # fmt: skip
        channel = inst.attribute("channel_id") if inst.computation not in self.sparsecore else None
        self.record((context, f"{kind.value}:{channel or inst.name}"), item)

    def walk(self, computation: str, multiplier: int, context: int) -> None:
        for inst in self.module.computations.get(computation, []):
            if inst.opcode == "while":
                count = trip_count(self.text, self.module, inst.attribute("condition") or "", inst)
                self.walk((inst.attribute("body") or "").lstrip("%"), multiplier * count, id(inst))
            elif inst.opcode == "fusion" and "all-reduce-scatter" in (inst.attribute("calls") or ""):
                self.reduce_scatter_fusion(inst, multiplier, context)
            elif inst.opcode == "fusion" and self.continues_async_collective(inst):
                continue  # its collective is the start's, counted there once
            elif (found := _dcn_transfer(inst)) is not None:
                self.dcn(inst, found, multiplier, context)
            elif (kind := _KINDS.get(inst.opcode)) is not None:
                self.collective(inst, kind, multiplier, context)
            else:
                for callee in inst.callees:
                    if callee in self.module.computations and callee != computation:
                        self.walk(callee, multiplier, context)


def _sparsecore_computations(hlo_text: str) -> frozenset[str]:
    """The computations the dump puts on the SparseCore's thread (a computation opens unindented,
    ``%name (...`` and closes ``}, execution_thread="sparsecore"``)."""
    found, current = set(), None
    for line in hlo_text.splitlines():
        if line.startswith("%"):
            current = line[1:].split(" ", 1)[0]
        elif line.startswith('}, execution_thread="sparsecore"') and current is not None:
            found.add(current)
    return frozenset(found)


# libtpu's async collective fusion (v5e's default): a collective runs as a chain of fusions that
# share its ``channel_id``: a start (a kCustom fusion whose root is a custom-call of this target)
# sets it going on the links, continuation fusions run compute beside it, each holding the
# collective and passing its buffers through to their results (aliased, not copied), and a done
# (the same, with the done target) awaits it, often after a loop the continuations ran in.
ASYNC_COLLECTIVE_TARGETS = {'"AsyncCollectiveStart"': "start", '"AsyncCollectiveDone"': "done"}


def async_collective_role(fused: list[Instruction]) -> str | None:
    """``start`` or ``done`` when ``fused`` (a fusion's computation) begins or ends an async
    collective (`ASYNC_COLLECTIVE_TARGETS`), else ``None``."""
    root = next((i for i in fused if i.is_root), None)
    if root is None or root.opcode != "custom-call":
        return None
    return ASYNC_COLLECTIVE_TARGETS.get(root.attribute("custom_call_target") or "")


def step_collectives(hlo_text: str) -> list[StepCollective]:
    """Every collective one device runs in a step of the optimized HLO module ``hlo_text``
    (XLA's dump after optimizations), loops unrolled by count."""
    walk = _StepWalk(hlo_text)
    walk.walk(walk.module.entry, 1, 0)
    return [replace(c, bytes_sent_per_device=c.bytes_sent_per_device * c.count) for c in walk.seen.values()]


def splash_kernels(hlo_text: str) -> int:
    """How many splash attention kernels (Pallas ``tpu_custom_call`` instructions named
    ``splash_*``: forward, the backward's dq and dkv) the optimized module runs, loop bodies once.
    The TPU compiler's own kernels (``online-softmax`` for dot attention) are not counted."""
    return len(re.findall(r"%splash_\S* = .*custom_call_target=\"tpu_custom_call\"", hlo_text))


_LEAF = re.compile(r"(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[\d,]*)\](?P<layout>\{[^}]*\})?")


def shape_leaves(shape_text: str, every_space: bool = False) -> list[tuple[tuple[int, ...], int]]:
    """(dims, bytes) of each array of an HLO shape. Bytes count in HBM only: an array whose
    layout names another memory space (``S(1)``: the core's vector memory, ``S(5)``: the
    host's) counts 0 unless ``every_space``."""
    out = []
    for m in _LEAF.finditer(re.sub(r"/\*.*?\*/", "", shape_text)):
        if m.group("dtype") not in DTYPE_BYTES:
            continue
        dims = tuple(int(d) for d in m.group("dims").split(",") if d)
        elsewhere = re.search(r"S\((\d+)\)", m.group("layout") or "")
        on_hbm = every_space or elsewhere is None or elsewhere.group(1) == "0"
        out.append((dims, math.prod(dims) * DTYPE_BYTES[m.group("dtype")] if on_hbm else 0))
    return out


def leaf_layouts(shape_text: str) -> list[str]:
    """The layout of each array of an HLO shape in order, tuples flattened (``((a, b), c)``: a's,
    b's, c's), every dtype; ``""`` for an array written without one."""
    return [m.group("layout") or "" for m in _LEAF.finditer(re.sub(r"/\*.*?\*/", "", shape_text))]


def hbm_bytes(shape_text: str) -> int:
    """Bytes of an HLO shape held in HBM (`shape_leaves`)."""
    return sum(b for _, b in shape_leaves(shape_text))
