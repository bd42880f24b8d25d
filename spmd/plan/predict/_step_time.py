"""A predicted step time: a model of the compiled program, read from the TPU compiler's optimized,
scheduled HLO (pure Python).

Each operation the device runs (a fusion, a dot, a Pallas kernel, a copy) takes the longer of its
compute time and its memory time, a roofline per operation: compute is its matmul FLOPs (the dots
and convolutions inside it; a splash attention kernel's from its q, k and v shapes) over the
device's peak, times a matmul efficiency and the share of the matrix unit its dims fill (a splash
kernel's matmuls over the head dim fill ``head_dim / MXU`` of a unit deeper than it); memory
is the bytes it reads and writes in HBM over the device's HBM bandwidth (a slice of a stacked
array counts the slice, an in-place update the update).

A collective takes a latency per ring step plus the bytes a ring sends per device over the links
its group crosses: on ICI, a share of the chip's bandwidth by the torus dimensions the group spans
(a ring along one of three dimensions uses a third of the links); between slices, DCN.

The schedule decides what overlaps. Each computation is walked in its scheduled order: an async
collective (``all-gather-start`` ... ``all-gather-done``, an ``async-start`` of one) runs on its
link while the operations scheduled between its start and its done run; a synchronous one stalls
the device until it ends; collectives on one link run one after another; host transfers
(a ``copy-start``, or an ``async-start`` of a slice, to or from host memory) run on the chip's
PCIe link, one link each way. A ``while`` loop (the scanned layers) costs
its body's time times its trip count: libtpu's own ``optimal_seconds`` counts loop bodies once.

A step across slices takes longer than its program by a share per doubling of the slices
(`Calibration.slice_factor`), fitted on published runs: libtpu's schedule hides the DCN sends
of the program, not the slices' waits for each other.

The few figures the model cannot derive (a matmul efficiency per chip generation, a ring step's
latency, the slice term) are `spmd.plan.predict._calibration.CALIBRATION`, shared by every plan;
the chip's own (peak, HBM, ICI, DCN and PCIe bandwidths) are its
`spmd.plan.request.topology.ChipSpec`.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from spmd.hlo import HloModuleText, Instruction
from spmd.inspector.collectives import CollectiveKind, parse_replica_groups, ring_bytes_sent
from spmd.plan.compile.program import async_collective_role, hbm_bytes, leaf_layouts, shape_leaves, trip_count
from spmd.plan.errors import PlanError
from spmd.plan.predict._calibration import CALIBRATION, Calibration
from spmd.plan.predict._op_costs import SLICING as _SLICING
from spmd.plan.predict._op_costs import (
    attended_pairs,
    declared_blocks,
    splash_head_dim_matmuls,
    splash_matmuls,
    splash_window,
    window_taps,
)
from spmd.plan.predict._op_costs import dims as _dims
from spmd.plan.predict._op_costs import fill as _fill
from spmd.plan.predict._op_costs import in_place_update as _in_place_update
from spmd.plan.predict._op_costs import source as _source
from spmd.plan.predict._op_costs import users_of as _users
from spmd.plan.predict._op_costs import uses as _uses
from spmd.plan.request.topology import TpuSlice

__all__ = [
    "CALIBRATION",
    "Calibration",
    "FlopsEntry",
    "StepTime",
    "predict_step",
    "splash_head_dim_matmuls",
    "splash_matmuls",
]


@dataclass(frozen=True)
class StepTime:
    """The predicted time of one step, per device (seconds), and what makes it up.

    Attributes:
        seconds: the predicted step time (the schedule walked, loops times their trip counts).
        op_seconds: the operations' own time, no communication: each the longer of its
            ``matmul`` and ``memory`` time.
        matmul_seconds: FLOP time summed over operations (at peak x efficiency).
        memory_seconds: HBM time summed over operations.
        collective_seconds: the links' busy time summed over collectives (ICI and DCN).
        exposed_seconds: the part of ``seconds`` not spent in operations: communication the
            schedule does not hide, and ``cross_slice_seconds``.
        hardware_flops: matmul FLOPs the program runs per device, recomputation included.
        hbm_bytes: bytes the operations move in HBM, per device.
        flops_by_op: where ``hardware_flops`` come from, op by op, largest first (`FlopsEntry`).
        cross_slice_seconds: the part of ``seconds`` a step across slices adds to its program's
            (`Calibration.slice_factor`: the slices' waits for each other; 0 on one slice).
    """

    seconds: float
    op_seconds: float
    matmul_seconds: float
    memory_seconds: float
    collective_seconds: float
    exposed_seconds: float
    hardware_flops: float
    hbm_bytes: float
    flops_by_op: tuple[FlopsEntry, ...] = ()
    cross_slice_seconds: float = 0.0


@dataclass(frozen=True)
class FlopsEntry:
    """One operation's matmul FLOPs in the step, per device.

    Attributes:
        op: its name in the optimized HLO (``fusion.372``, ``splash_mha_dkv_no_residuals.1``).
        opcode: ``fusion``, ``dot``, ``convolution`` or ``custom-call`` (a Pallas kernel).
        shape: its result's shape, as the HLO writes it (cut at 120 characters).
        loops: the ``while`` loops around it, outermost first, each ``(name, trip count)``: the
            layer scan, a loss's chunks, a loop the partitioner wrote (a windowed einsum).
        flops_per_run: its FLOPs each time it runs.
        runs: how many times the step runs it (the product of its loops' trip counts).
    """

    op: str
    opcode: str
    shape: str
    loops: tuple[tuple[str, int], ...]
    flops_per_run: float
    runs: float

    @property
    def flops(self) -> float:
        return self.flops_per_run * self.runs


@dataclass
class _Totals:
    op: float = 0.0
    matmul: float = 0.0
    memory: float = 0.0
    collective: float = 0.0
    flops: float = 0.0
    nbytes: float = 0.0


# Opcodes that move no data and run no kernel of their own.
_FREE = frozenset(
    {
        "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
        "replica-id", "opt-barrier", "add-dependency", "domain", "iota",
    }
)  # fmt: skip
_COLLECTIVES = {k.value: k for k in CollectiveKind}
_STARTS = {f"{k.value}-start": k for k in CollectiveKind}
_DONES = frozenset({f"{k.value}-done" for k in CollectiveKind} | {"async-done", "copy-done", "recv-done", "send-done"})
_HOST_MEMORY = "S(5)"  # memory space 5 in a layout: the host's pinned memory
_FLOAT_ARRAY = re.compile(r"\b(?:bf16|f16|f32|f8e\w*)\[([\d,]*)\]")


@functools.lru_cache(maxsize=1)
def _parsed(hlo_text: str) -> HloModuleText:
    """The module, parsed; the last one is kept (one only: a large model's is hundreds of MiB), as
    the calibration benchmark predicts one program at hundreds of constants, and parsing is
    nearly half of each prediction (a 7.6 MB program: 0.27 s of 0.60 s)."""
    return HloModuleText.parse(hlo_text)


def _carried_by_collective(
    fused: list[Instruction], root: Instruction | None, users: dict[str, list[Instruction]]
) -> set[str]:
    """In a continuation of libtpu's async collective (`spmd.plan.compile.program.ASYNC_COLLECTIVE_TARGETS`:
    a fusion holding a collective): the collective and the parameters it reads or passes through to
    the results, which the links move and the results alias; their bytes are the collective's, not
    the fusion's HBM traffic. Empty for any other fusion. ``users``: `_users` of ``fused``."""
    collectives = {i.name for i in fused if i.opcode in _COLLECTIVES}
    if not collectives:
        return set()
    carried = set(collectives)
    for param in (i for i in fused if i.opcode == "parameter"):
        uses = users.get(param.name, [])
        if uses and all(u.name in collectives or u is root for u in uses):
            carried.add(param.name)
    return carried


class _Program:
    """One optimized module and the chip it runs on: each operation's cost, each computation's
    time (module docstring)."""

    def __init__(self, hlo_text: str, target: TpuSlice, calibration: Calibration):
        self.text = hlo_text
        try:
            self.module = _parsed(hlo_text)
        except (TypeError, ValueError) as e:
            raise PlanError(f"Cannot predict a step time: {e}") from None
        self.by_name = self.module.instructions_by_name
        self.target, self.cal = target, calibration
        chip = target.chip
        self.matmul_efficiency, self.attention_efficiency = calibration.efficiencies(chip.libtpu_name)
        self.peak = chip.device_peak_flops
        self.hbm = chip.device_hbm_bytes_per_second or math.inf
        self.host_link = calibration.host_bytes_per_second(chip) / chip.devices_per_chip
        self.totals = _Totals()
        self.flops_by_op: dict[tuple[tuple[tuple[str, int], ...], str], FlopsEntry] = {}
        # Per program, not per class: a method's functools.cache keys on ``self`` and so kept every
        # program (its parsed module, GiB for a 405B) alive for the process's life.
        self._matmul_seconds = functools.cache(self._matmul_seconds)
        self._async_collective = functools.cache(self._async_collective)
        self._flat = functools.cache(self._flat)

    # -- operations ------------------------------------------------------------------------
    def _operand(self, inst: Instruction, k: int) -> list[tuple[tuple[int, ...], int]]:
        """The arrays operand ``k`` of ``inst`` reads: (dims, HBM bytes) each (`_leaves`)."""
        source = self.by_name.get(inst.operands[k]) if k < len(inst.operands) else None
        if source is None:
            return []
        leaves = shape_leaves(source.shape_text)
        index = inst.operand_outputs[k] if k < len(inst.operand_outputs) else None
        return leaves[index : index + 1] if index is not None else leaves

    def _shape_of(self, inst: Instruction, k: int) -> tuple[int, ...]:
        found = self._operand(inst, k)
        return found[0][0] if found else ()

    def _operand_bytes(self, inst: Instruction, k: int) -> int:
        return sum(b for _, b in self._operand(inst, k))

    def _dot(self, inst: Instruction) -> tuple[float, float]:
        """(FLOPs, matrix-unit fill) of a ``dot``: 2 x result elements x contracted size."""
        lhs = self._shape_of(inst, 0)
        contracting = [lhs[d] for d in _dims(inst.attribute("lhs_contracting_dims")) if d < len(lhs)]
        k = math.prod(contracting)
        out = inst.arrays[0].dims if inst.arrays else ()
        n = out[-1] if out else 1
        m = out[-2] if len(out) > 1 else 1
        mxu = self.target.chip.mxu
        return 2.0 * math.prod(out) * k, _fill(k, mxu) * _fill(n, mxu) * _fill(m, mxu)

    def _convolution(self, inst: Instruction) -> tuple[float, float]:
        """A ``convolution`` (how the TPU compiler often writes a matmul): 2 x result elements x
        input features x the window taps that meet the input (the compiler writes some batched
        matmuls as a window as long as the batch over an input of length 1: one tap each)."""
        lhs, kernel = self._shape_of(inst, 0), self._shape_of(inst, 1)
        inputs, _, output = (inst.attribute("dim_labels") or "").partition("->")
        labels = inputs.split("_")
        out = inst.arrays[0].dims if inst.arrays else ()
        if len(labels) != 2 or len(labels[1]) != len(kernel) or len(labels[0]) != len(lhs) or "o" not in labels[1]:
            return 0.0, 1.0
        n = kernel[labels[1].index("o")]
        k = kernel[labels[1].index("i")] if "i" in labels[1] else 1
        # the window lists the spatial dims in number order, not in the kernel's (``1oi0``)
        spatial = sorted((label for label in labels[1] if label.isdigit()), key=int)
        if spatial and all(s in labels[0] and s in output for s in spatial) and len(output) == len(out):
            lengths = tuple(lhs[labels[0].index(s)] for s in spatial)
            k *= window_taps(inst.attribute("window"), lengths, tuple(out[output.index(s)] for s in spatial))
        else:
            for axis, label in enumerate(labels[1]):
                if label.isdigit():
                    taps = lhs[labels[0].index(label)] if label in labels[0] else kernel[axis]
                    k *= min(kernel[axis], taps)
        mxu = self.target.chip.mxu
        m = math.prod(out) // max(n, 1)
        return 2.0 * math.prod(out) * k, _fill(k, mxu) * _fill(n, mxu) * _fill(m, mxu)

    def _matmul_seconds(self, computation: str) -> tuple[float, float]:
        """(FLOPs, seconds at peak x efficiency x fill) of the matmuls in a fused computation."""
        flops = seconds = 0.0
        for inst in self.module.computations.get(computation, []):
            if inst.opcode in ("dot", "convolution"):
                f, fill = self._dot(inst) if inst.opcode == "dot" else self._convolution(inst)
                flops += f
                seconds += f / (self.peak * self.matmul_efficiency * fill) if f else 0.0
            for callee in inst.callees:
                f, s = self._matmul_seconds(callee)
                flops, seconds = flops + f, seconds + s
        return flops, seconds

    def _kernel(self, inst: Instruction) -> tuple[float, float]:
        """(FLOPs, matrix-unit fill) of a Pallas kernel: its own cost estimate when the lowering
        gave one (fill 1), else for a splash attention kernel from its q, k, v shapes
        (`splash_matmuls`), causal or over its sliding window, each pair of blocks the mask
        reaches run whole (`attended_pairs`; the blocks the kernel declares, else those of the
        planner's window scope); other kernels are costed
        by their bytes only. A splash kernel's matmuls that contract over the head dim (q k^T, and
        dO v^T in backward) fill ``head_dim / MXU`` of a matrix unit deeper than it (half of
        TPU7x's and v6e's 256 for a head of 128); the others contract over a block of the sequence
        and can fill it (`splash_head_dim_matmuls`)."""
        found = re.search(r'\\?"flops\\?"\s*:\s*\\?"?(\d+)', inst.attributes)
        if found:
            return float(found.group(1)), 1.0
        # the operands' shapes as the kernel declares them (its operands may be tuple elements): q,
        # k and v are its first floating ones; its mask tables are integers, int16 from 128 blocks
        # of keys on (131,072 tokens in blocks of 512), where a byte-size rule took one for q
        declared = inst.attribute("operand_layout_constraints") or ""
        qkv = [_dims(m.group(1)) for m in _FLOAT_ARRAY.finditer(declared) if len(_dims(m.group(1))) >= 3]
        op_name = inst.metadata.get("op_name", "")
        matmuls = splash_matmuls(inst.name, op_name)
        if len(qkv) < 2 or not matmuls:
            return 0.0, 1.0
        q, k = qkv[0], qkv[1]
        heads = math.prod(q[:-2])
        deep = splash_head_dim_matmuls(inst.name, op_name)
        fill = matmuls / (matmuls - deep + deep / _fill(q[-1], self.target.chip.mxu))
        scope = splash_window(op_name)
        blocks = declared_blocks(inst.name, inst.attributes) or (scope.blocks_of(inst.name) if scope else None)
        pairs = attended_pairs(q[-2], k[-2], scope.window if scope else None, blocks)
        return matmuls * 2.0 * heads * pairs * q[-1], fill

    def _fusion_bytes(self, inst: Instruction, computation: str) -> float:
        """HBM bytes of a fusion: each operand read whole, except one only sliced inside (a
        layer's block of a stacked array: the slices count) or updated in place (nothing read);
        each result written whole, except an in-place update (the update counts). A bitcast, or a
        nested fusion aliased to its operand (a relayout in place, which libtpu 0.0.52 puts around
        each stacked array of the layer scan), passes its operand through: counted as whole reads
        and writes, they made a slice of a 20 GiB stack cost 20 GiB in each layer."""
        fused = self.module.computations.get(computation, [])
        users, local = _users(fused), {i.name: i for i in fused}
        params = {i.argument: i for i in fused if i.opcode == "parameter"}
        root = next((i for i in fused if i.is_root), None)
        outputs = [] if root is None else [local[o] for o in root.operands] if root.opcode == "tuple" else [root]
        carried = _carried_by_collective(fused, root, users)
        in_place, total = set(), 0.0
        for out in outputs:
            if out.name in carried:
                continue
            update = _in_place_update(out, local)
            if update is None:
                total += hbm_bytes(out.shape_text)
            else:
                in_place.add(update[0])
                total += hbm_bytes(update[1].shape_text) if update[1] is not None else 0.0
        for k in range(len(inst.operands)):
            param = params.get(k)
            if param is not None and (param.name in in_place or param.name in carried):
                continue
            uses = _uses(param.name, users) if param is not None else []
            if uses and all(u.opcode in _SLICING and _source(u.operands[0], local) == param.name for u in uses):
                total += sum(hbm_bytes(u.shape_text) for u in uses)
            else:
                total += self._operand_bytes(inst, k)
        return total

    def _op_bytes(self, inst: Instruction) -> float:
        if inst.opcode == "fusion":
            return self._fusion_bytes(inst, inst.calls)
        if inst.opcode in _SLICING:
            return 2.0 * hbm_bytes(inst.shape_text)
        if inst.opcode == "dynamic-update-slice":
            return 2.0 * self._operand_bytes(inst, 1)
        return hbm_bytes(inst.shape_text) + sum(self._operand_bytes(inst, k) for k in range(len(inst.operands)))

    def _async_collective(self, computation: str) -> tuple[str, Instruction] | None:
        """(``start`` or ``done``, the collective) of a fused ``computation`` that begins or ends
        one of libtpu's async collectives (`async_collective_role`), else ``None``. Cached per
        program: a loop body's fusions are looked at again for each loop around it."""
        fused = self.module.computations.get(computation, [])
        role = async_collective_role(fused)
        found = next((i for i in fused if i.opcode in _COLLECTIVES), None) if role else None
        return None if found is None else (role, found)  # type: ignore[return-value]

    def op_seconds(self, inst: Instruction, scale: float, loops: tuple[tuple[str, int], ...] = ()) -> float:
        """One operation's time: the longer of its matmul and its memory time; the totals count
        it ``scale`` times (the ``loops`` around it), and its FLOPs are listed (`FlopsEntry`)."""
        if inst.opcode == "custom-call":
            flops, fill = self._kernel(inst)
            matmul = flops / (self.peak * self.attention_efficiency * fill)
        elif inst.opcode in ("dot", "convolution"):
            flops, fill = self._dot(inst) if inst.opcode == "dot" else self._convolution(inst)
            matmul = flops / (self.peak * self.matmul_efficiency * fill) if flops else 0.0
        elif inst.opcode == "fusion":
            flops, matmul = self._matmul_seconds(inst.calls)
        else:
            flops = matmul = 0.0
        nbytes = self._op_bytes(inst)
        memory = nbytes / self.hbm
        if flops:
            key = (loops, inst.name)
            seen = self.flops_by_op.get(key)
            runs = scale + (seen.runs if seen else 0.0)  # a computation walked twice (both branches) adds up
            self.flops_by_op[key] = FlopsEntry(inst.name, inst.opcode, inst.shape_text[:120], loops, flops, runs)
        t = self.totals
        t.flops, t.nbytes = t.flops + flops * scale, t.nbytes + nbytes * scale
        t.matmul, t.memory = t.matmul + matmul * scale, t.memory + memory * scale
        t.op += max(matmul, memory) * scale
        return max(matmul, memory)

    # -- collectives -----------------------------------------------------------------------
    def _link_seconds(self, kind: CollectiveKind, nbytes: int, members: tuple[int, ...]) -> float:
        """A collective on ICI: ring steps x latency + ring bytes over the links its group spans."""
        n = len(members)
        if n <= 1:
            return 0.0
        chip, target = self.target.chip, self.target
        sent = ring_bytes_sent(kind, nbytes, n) if kind is not CollectiveKind.COLLECTIVE_PERMUTE else nbytes
        chips = math.ceil(n / chip.devices_per_chip)
        if chips <= 1:  # the two TensorCores of one chip: through its own memory
            return sent / self.hbm
        sides = sorted(s for s in target.shape if s > 1)
        spanned, covered = 0, 1
        while covered < chips and spanned < len(sides):
            covered, spanned = covered * sides[spanned], spanned + 1
        share = max(spanned, 1) / max(len(sides), 1)
        steps = n - 1 if kind is not CollectiveKind.ALL_REDUCE else 2 * (n - 1)
        bandwidth = chip.device_allreduce_bytes_per_second * share
        return steps * self.cal.ring_step_seconds + sent / bandwidth

    def _host_transfer(self, nbytes: float, to_host: bool) -> tuple[str, float]:
        """(link, seconds) of a DMA between HBM and host memory: each direction of the chip's
        PCIe link is its own (full duplex), shared by the chip's devices."""
        return ("to-host" if to_host else "from-host"), nbytes / self.host_link

    def collective(self, inst: Instruction) -> tuple[str, float] | None:
        """(link, seconds) of a collective (sync, a ``*-start`` or an ``async-start`` of one) or a
        host transfer (a ``copy-start``, or an ``async-start`` of a slice, to or from host memory:
        libtpu writes offloaded residuals into host-memory stacks that way); ``None`` for anything
        else."""
        if inst.opcode == "copy-start":
            nbytes = inst.arrays[0].nbytes if inst.arrays else 0
            if _HOST_MEMORY not in inst.shape_text:
                return "copy", nbytes / self.hbm
            to_host = _HOST_MEMORY in leaf_layouts(inst.shape_text)[0]  # (destination, source, context)
            return self._host_transfer(nbytes, to_host)
        if inst.opcode == "async-start" and _HOST_MEMORY in inst.shape_text:
            # a slice of a host-memory stack read onto the device (dynamic-slice), or a device
            # array written into one (dynamic-update-slice): ((operands), result, context). The
            # DMA moves the device-side array, the slice; the device does not run it.
            layouts = leaf_layouts(inst.shape_text)
            to_host = len(layouts) > 1 and _HOST_MEMORY in layouts[-2]
            return self._host_transfer(hbm_bytes(inst.shape_text), to_host)
        if inst.opcode == "send" and "_xla_megascale_transfer_type" in inst.attributes:
            arrays = inst.arrays
            sent = 2 * arrays[0].nbytes if arrays else 0  # a ring over slices sends about twice the data
            return "dcn", sent / self.target.chip.device_dcn_bytes_per_second
        kind, source = _COLLECTIVES.get(inst.opcode) or _STARTS.get(inst.opcode), inst
        if inst.opcode == "async-start" or (inst.opcode == "fusion" and "all-reduce-scatter" in inst.attributes):
            source = next((i for c in inst.callees for i in self._flat(c) if i.opcode in _COLLECTIVES), None)
            kind = _COLLECTIVES[source.opcode] if source is not None else None
            if source is not None and "all-reduce-scatter" in inst.attributes:
                kind = CollectiveKind.REDUCE_SCATTER
        if kind is None or source is None:
            return None
        return self._ici(kind, source, inst)

    def _ici(self, kind: CollectiveKind, source: Instruction, inst: Instruction) -> tuple[str, float]:
        """(``ici``, seconds) of the collective ``source`` (``inst`` itself, or the collective it
        wraps) on the slice's links."""
        arrays = source.arrays  # the wrapped collective's own result, or the start's (operands, results, ...)
        if source.opcode.endswith("-start") and len(arrays) > 1:
            arrays = arrays[1:2] if kind is CollectiveKind.COLLECTIVE_PERMUTE else arrays[len(arrays) // 2 :]
        if "all-reduce-scatter" in inst.attributes:  # a reduce-scatter fusion: its result is the shard
            arrays = inst.arrays if inst.opcode == "fusion" else arrays
        nbytes = sum(a.nbytes for a in arrays)
        if kind is CollectiveKind.COLLECTIVE_PERMUTE:
            members: tuple[int, ...] = (0, self.target.chip.devices_per_chip)  # a neighbour, one hop
        else:
            members = parse_replica_groups(source.attribute("replica_groups"), self.module.num_partitions)[0]
        return "ici", self._link_seconds(kind, nbytes, members)

    def _flat(self, computation: str) -> tuple[Instruction, ...]:
        """A computation's instructions and those of every computation it calls."""
        out: list[Instruction] = []
        for inst in self.module.computations.get(computation, []):
            out.append(inst)
            for callee in inst.callees:
                out += self._flat(callee)
        return tuple(out)

    # -- the schedule ----------------------------------------------------------------------
    def _trips(self, inst: Instruction) -> int:
        """A loop's trip count: the compiler's ``known_trip_count``, else its condition's bound."""
        known = re.search(r'known_trip_count\\?"\s*:\s*\{\s*\\?"n\\?"\s*:\s*\\?"(\d+)', inst.attributes)
        if known:
            return int(known.group(1))
        return trip_count(self.text, self.module, inst.attribute("condition") or "", inst)

    def seconds(self, computation: str, scale: float, loops: tuple[tuple[str, int], ...] = ()) -> float:
        """The time of one run of ``computation`` in its scheduled order (module docstring);
        ``scale``: how many times the step runs it (for the totals); ``loops``: the ``while``
        loops it runs in, each ``(name, trip count)``."""
        clock, free, pending = 0.0, {}, {}  # device time; when each link frees; async ends by start
        for inst in self.module.computations.get(computation, []):
            if inst.opcode in _FREE or inst.opcode == "recv":
                continue
            if inst.opcode == "while":
                count = self._trips(inst)
                body = (inst.attribute("body") or "").lstrip("%")
                clock += count * self.seconds(body, scale * count, (*loops, (inst.name, count)))
            elif inst.opcode in ("call", "conditional"):
                clock += max((self.seconds(c, scale, loops) for c in inst.callees), default=0.0)
            elif inst.opcode == "async-update":  # a SparseCore collective's start, update, done
                if inst.operands and inst.operands[0] in pending:
                    pending[inst.name] = pending.pop(inst.operands[0])
            elif inst.opcode in _DONES:
                clock = max(clock, pending.pop(inst.operands[0], clock)) if inst.operands else clock
            elif inst.opcode == "fusion" and (async_collective := self._async_collective(inst.calls)) is not None:
                role, inner = async_collective  # start and done match by the collective's channel
                key = f"channel {inner.attribute('channel_id')}"
                if role == "done":
                    clock = max(clock, pending.pop(key, clock))
                    continue
                _, t = self._ici(_COLLECTIVES[inner.opcode], inner, inner)
                pending[key] = free["ici"] = max(clock, free.get("ici", 0.0)) + t
                self.totals.collective += t * scale
            elif (found := self.collective(inst)) is not None:
                link, t = found
                end = max(clock, free.get(link, 0.0)) + t
                free[link] = end
                if link in ("ici", "dcn"):
                    self.totals.collective += t * scale
                if inst.opcode.endswith("-start") or inst.opcode == "send":
                    pending[inst.name] = end
                else:
                    clock = end
            else:
                clock += self.op_seconds(inst, scale, loops)
        return max([clock, *pending.values()])


def predict_step(hlo_text: str, target: TpuSlice, calibration: Calibration = CALIBRATION) -> StepTime:
    """The predicted step of the optimized, scheduled module ``hlo_text`` on ``target``.

    Raises:
        PlanError: ``hlo_text`` is not an HLO module dump.
    """
    program = _Program(hlo_text, target, calibration)
    try:
        seconds = program.seconds(program.module.entry, 1.0)
    except (ValueError, IndexError, KeyError, RecursionError, ZeroDivisionError, OverflowError) as e:
        # the text is the compiler's, but untrusted: what it does not hold is our error, not a traceback
        raise PlanError(f"Cannot predict a step time: the HLO module is malformed ({type(e).__name__}: {e}).") from None
    t = program.totals
    by_op = tuple(sorted(program.flops_by_op.values(), key=lambda e: -e.flops))
    cross_slice = seconds * (calibration.slice_factor(target.slices) - 1.0)
    seconds += cross_slice
    return StepTime(
        seconds, t.op, t.matmul, t.memory, t.collective, max(0.0, seconds - t.op), t.flops, t.nbytes, by_op, cross_slice
    )
