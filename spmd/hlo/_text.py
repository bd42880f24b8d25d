"""A reader for XLA's HLO text dumps: instructions, shapes, parameters, metadata (pure Python).

It reads what ``--xla_dump_hlo_as_text`` writes (``*before_optimizations.txt`` and the
partitioned, scheduled ``*after_optimizations.txt``). It is not a full HLO parser: it keeps
what its readers need (each instruction's name, shape, opcode, operands and attributes)
and follows values back through bitcasts, copies, converts, tuples and optimization barriers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from spmd.hlo._shape import DTYPE_BYTES, ArrayShape, parse_shape

__all__ = [
    "ArrayShape",
    "Instruction",
    "HloModuleText",
    "parse_shape",
    "module_scope",
    "annotation_scopes",
    "DTYPE_BYTES",
]


@dataclass(frozen=True)
class Instruction:
    """One HLO instruction.

    Attributes:
        name: the instruction's name without ``%``.
        shape_text: the shape as printed (array or tuple).
        opcode: e.g. ``all-gather``, ``parameter``, ``fusion``.
        operands: names of the operand instructions, in order.
        attributes: the text after the operand list (``channel_id=1, replica_groups=...``).
        computation: the name of the computation it belongs to.
        is_root: whether it is its computation's ROOT.
        argument: for ``parameter(k)``, ``k``; for ``get-tuple-element``, the index.
        operand_outputs: for each operand, which element of its tuple it reads when the dump
            names one (``%call-start.1#2``, libtpu's shorthand for a tuple element), else None.
    """

    name: str
    shape_text: str
    opcode: str
    operands: tuple[str, ...]
    attributes: str
    computation: str
    is_root: bool = False
    argument: int | None = None
    operand_outputs: tuple[int | None, ...] = ()

    @property
    def arrays(self) -> tuple[ArrayShape, ...]:
        """The arrays this instruction produces (a tuple shape gives several)."""
        return parse_shape(self.shape_text)

    @property
    def nbytes(self) -> int:
        """Bytes of the instruction's result (all leaves of a tuple)."""
        return sum(a.nbytes for a in self.arrays)

    def attribute(self, key: str) -> str | None:
        """The raw text of attribute ``key`` (braces balanced), or ``None``."""
        return _attribute(self.attributes, key)

    @property
    def calls(self) -> str:
        """The computation a fusion or a call runs (its ``calls``), ``""`` for other operations."""
        return (self.attribute("calls") or "").lstrip("%")

    @property
    def callees(self) -> list[str]:
        """The computations this instruction runs: fusions, reductions, loops, conditionals, and
        the ``called_computations`` of custom calls and async wrappers (libtpu 0.0.52 wraps
        offloaded collectives in one)."""
        names = []
        for key in ("calls", "to_apply", "body", "branch_computations", "called_computations"):
            value = self.attribute(key)
            if value:
                names += [n.strip().lstrip("%") for n in value.strip("{}").split(",") if n.strip()]
        return names

    @property
    def metadata(self) -> dict[str, str]:
        """The ``metadata={...}`` fields: op_type, op_name, source_file, source_line."""
        raw = self.attribute("metadata")
        if not raw:
            return {}
        return {m.group(1): m.group(2) if m.group(2) is not None else m.group(3) for m in _META_RE.finditer(raw)}

    @property
    def sharding(self) -> str | None:
        """The ``sharding={...}`` text, if any."""
        return self.attribute("sharding")


# torch_xla's op scopes (``aten__add``) and annotation scopes a library opens to label what it
# traces (``fsdp__forward-gather__h.0``): a word then ``__``, which no module path starts with.
_OP_SCOPE = re.compile(r"^[A-Za-z0-9]+__")


def module_scope(op_name: str) -> str:
    """The innermost module scope of an HLO ``op_name``: ``'M.1/blocks.0.3/aten__mm'`` ->
    ``'blocks.0'``. torch_xla appends ``.N`` to each scope it opens, and opens scopes of its
    own for some ops (``.../aten__add.1/aten__add``), which are skipped, as are annotation
    scopes (`annotation_scopes`)."""
    parts = [p for p in op_name.split("/")[:-1] if not _OP_SCOPE.match(p)]
    return re.sub(r"\.\d+$", "", parts[-1]) if parts else ""


def annotation_scopes(op_name: str, prefix: str) -> tuple[str, ...]:
    """The scopes of ``op_name`` that start with ``prefix`` (a label such as ``'fsdp__'``), outer
    first, without torch_xla's ``.N`` suffix: ``'M.1/fsdp__reduce__h.0.7/xla__custom_sharding'``
    -> ``('fsdp__reduce__h.0',)``. torch_xla writes a scope's ``:`` as ``_``, so labels use ``__``."""
    return tuple(re.sub(r"\.\d+$", "", p) for p in op_name.split("/")[:-1] if p.startswith(prefix))


_META_RE = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^\s}]+))')


def _balanced(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket that closes the one at ``start``."""
    depth = 0
    in_string = False
    i = start
    while i < len(text):
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"Unbalanced {open_ch}{close_ch} in HLO text: {text[start : start + 80]!r}...")


@functools.lru_cache(maxsize=128)
def _key_pattern(key: str) -> re.Pattern[str]:
    """``key=`` at an attribute's start, compiled once: the step-time model looks attributes up
    hundreds of thousands of times a program, and escaping the key and finding its pattern each
    time took 30 % of a prediction from a parsed program (a 7.6 MB program: 0.47 s, now 0.33)."""
    return re.compile(r"(?:^|[,\s])" + re.escape(key) + r"=")


def _attribute(attrs: str, key: str) -> str | None:
    m = _key_pattern(key).search(attrs)
    if not m:
        return None
    start = m.end()
    if start < len(attrs) and attrs[start] == "{":
        return attrs[start : _balanced(attrs, start, "{", "}")]
    end = start
    depth = 0
    while end < len(attrs):
        ch = attrs[end]
        if ch in "([{":  # braces: the named-axis replica groups, mesh[...] {'a','b'}
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            break
        end += 1
    return attrs[start:end].strip()


_HEAD_RE = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*")
_COMPUTATION_RE = re.compile(r"^\s*(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(?:\(.*)?\{\s*$")


def _parse_instruction(line: str, computation: str) -> Instruction | None:
    head = _HEAD_RE.match(line)
    if not head:
        return None
    rest = line[head.end() :]
    if rest.startswith("("):
        shape_end = _balanced(rest, 0, "(", ")")
    else:
        m = re.match(r"[a-z][a-z0-9]*\[[0-9,\s]*\](?:\{[^}]*\})?|token\[\]|[a-z][a-z0-9]*\[\]", rest)
        if not m:
            return None
        shape_end = m.end()
    shape_text = rest[:shape_end]
    rest = rest[shape_end:].lstrip()
    m = re.match(r"(?P<opcode>[\w\-]+)\(", rest)
    if not m:
        return None
    opcode = m.group("opcode")
    close = _balanced(rest, m.end() - 1, "(", ")")
    inner = rest[m.end() : close - 1]
    attributes = rest[close:].lstrip(", ").strip()
    refs = re.findall(r"%([\w.\-]+)(?:#(\d+))?", inner)
    operands = tuple(name for name, _ in refs)
    outputs = tuple(int(k) if k else None for _, k in refs)
    argument = None
    if opcode == "parameter" and inner.strip().isdigit():
        argument = int(inner.strip())
    elif opcode == "get-tuple-element":
        index = _attribute(attributes, "index")
        argument = int(index) if index is not None and index.isdigit() else None
    return Instruction(
        name=head.group("name"),
        shape_text=shape_text,
        opcode=opcode,
        operands=operands,
        attributes=attributes,
        computation=computation,
        is_root=bool(head.group("root")),
        argument=argument,
        operand_outputs=outputs if any(k is not None for k in outputs) else (),
    )


# A computation ends with "}", or, on a non-main thread, '}, execution_thread="sparsecore"'.
_END_RE = re.compile(r'^\}(?:, execution_thread="[\w-]+")?\s*$')


def _instruction_lines(lines: list[str]) -> Iterator[str]:
    """The dump's lines with each instruction on one: an attribute string can hold newlines (a
    Pallas kernel's backend_config does), so a line that neither opens an instruction nor a
    computation nor closes one continues the line before it."""
    pending: str | None = None
    for line in lines:
        starts = bool(_HEAD_RE.match(line)) or bool(_COMPUTATION_RE.match(line)) or bool(_END_RE.match(line))
        if pending is not None and not starts and line.strip():
            pending += "\n" + line
            continue
        if pending is not None:
            yield pending
        pending = line
    if pending is not None:
        yield pending


# Opcodes that pass one operand's value through unchanged in content (layout, dtype or rank only).
_PASS_THROUGH = frozenset({"bitcast", "copy", "reshape", "transpose", "convert", "bitcast-convert"})


@dataclass
class HloModuleText:
    """A parsed HLO module dump (treat it as read-only once parsed: lookups are cached).

    Attributes:
        name: the module name (``SyncTensorsGraph.38``).
        header: the ``HloModule`` line.
        computations: instruction lists by computation name, in file order.
        entry: the name of the entry computation.
    """

    name: str
    header: str
    computations: dict[str, list[Instruction]] = field(default_factory=dict)
    entry: str = ""

    @classmethod
    def parse(cls, text: str) -> HloModuleText:
        """Parse the text of one HLO module dump.

        Raises:
            TypeError: ``text`` is not a string.
            ValueError: the text has no ``HloModule`` line or no entry computation.
        """
        if not isinstance(text, str):
            raise TypeError(f"HloModuleText.parse takes the dump's text (a str), got {type(text).__name__}.")
        lines = text.splitlines()
        header = next((ln for ln in lines if ln.startswith("HloModule ")), None)
        if header is None:
            raise ValueError("Not an HLO module dump: no 'HloModule' line.")
        module = cls(name=header.split()[1].rstrip(","), header=header)
        current: str | None = None
        for line in _instruction_lines(lines):
            if current is None:
                m = _COMPUTATION_RE.match(line)
                if m and not line.startswith("HloModule"):
                    current = m.group("name")
                    module.computations[current] = []
                    if m.group("entry"):
                        module.entry = current
                continue
            if _END_RE.match(line):
                current = None
                continue
            inst = _parse_instruction(line, current)
            if inst is not None:
                module.computations[current].append(inst)
        if not module.entry:
            raise ValueError(f"HLO module {module.name} has no ENTRY computation.")
        return module

    @property
    def num_partitions(self) -> int:
        """``num_partitions`` from the header (1 when absent)."""
        m = re.search(r"num_partitions=(\d+)", self.header)
        return int(m.group(1)) if m else 1

    @property
    def entry_instructions(self) -> list[Instruction]:
        """The entry computation's instructions, in schedule order for scheduled modules."""
        return self.computations[self.entry]

    def instructions(self) -> Iterator[Instruction]:
        """Every instruction of every computation."""
        for insts in self.computations.values():
            yield from insts

    def parameters(self) -> dict[int, Instruction]:
        """The entry computation's parameters by parameter number."""
        return {i.argument: i for i in self.entry_instructions if i.opcode == "parameter" and i.argument is not None}

    @functools.cached_property
    def users(self) -> dict[str, list[Instruction]]:
        """For each entry instruction name, the entry instructions that read it (built once)."""
        out: dict[str, list[Instruction]] = {}
        for inst in self.entry_instructions:
            for operand in inst.operands:
                out.setdefault(operand, []).append(inst)
        return out

    def scoped_uses(self, inst: Instruction, max_depth: int = 4) -> list[str]:
        """``op_name`` metadata of the nearest users of ``inst`` that carry a module scope,
        looking through up to ``max_depth`` levels of unscoped users (sharding annotations,
        copies)."""
        users = self.users
        frontier = [inst]
        seen = {inst.name}
        for _ in range(max_depth):
            next_frontier = []
            for node in frontier:
                for user in users.get(node.name, []):
                    if user.name not in seen:
                        seen.add(user.name)
                        next_frontier.append(user)
            scoped = [u.metadata.get("op_name", "") for u in next_frontier]
            scoped = [n for n in scoped if module_scope(n)]
            if scoped:
                return scoped
            frontier = next_frontier
        return []

    @functools.cached_property
    def by_name(self) -> dict[str, Instruction]:
        """The entry computation's instructions by name (built once)."""
        return {i.name: i for i in self.entry_instructions}

    @functools.cached_property
    def instructions_by_name(self) -> dict[str, Instruction]:
        """Every computation's instructions by name (built once; XLA names are unique in a module)."""
        return {i.name: i for i in self.instructions()}

    def source_parameter(self, inst: Instruction, max_depth: int = 32) -> int | None:
        """The entry parameter whose value ``inst`` carries, if any.

        Follows layout/dtype-only ops, tuples and ``get-tuple-element``, optimization barriers,
        and fusions with one non-constant operand; ``None`` when the value is computed.
        """
        by_name = self.by_name
        current: Instruction | None = inst
        tuple_index: int | None = None
        for _ in range(max_depth):
            if current is None:
                return None
            op = current.opcode
            if op == "parameter":
                return current.argument if tuple_index is None else None
            if op == "get-tuple-element":
                tuple_index = current.argument
                current = by_name.get(current.operands[0]) if current.operands else None
                continue
            if op == "tuple" and tuple_index is not None:
                if tuple_index >= len(current.operands):
                    return None
                current = by_name.get(current.operands[tuple_index])
                tuple_index = None
                continue
            if op == "opt-barrier":
                current = by_name.get(current.operands[0]) if current.operands else None
                continue
            if op in _PASS_THROUGH or op == "fusion" or op.startswith("all-gather"):
                inputs = [by_name.get(o) for o in current.operands]
                inputs = [i for i in inputs if i is not None and i.opcode not in ("constant", "iota")]
                if len(inputs) != 1:
                    return None
                current = inputs[0]
                continue
            return None
        return None
