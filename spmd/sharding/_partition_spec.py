"""`PartitionSpec` (alias `P`): how each tensor dim maps onto mesh axes; an immutable value."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from mesh import AxisRef
from mesh.checks import is_int
from spmd.errors import DuplicateAxisError, PartitionSpecTypeError

__all__ = ["PartitionSpec", "P", "SpecEntry", "spec_on_largest_dim"]

AxisName = AxisRef  # one name for a mesh axis, by name or index (mesh.AxisRef)
SpecEntry = AxisName | tuple[AxisName, ...] | None
"""One dim's entry: a mesh axis (name or index), a tuple of them (major to minor), or None."""


def _check_axis(axis: object, entries: tuple[object, ...], pos: int) -> AxisName:
    if isinstance(axis, str):
        if not axis.isidentifier():
            raise PartitionSpecTypeError(
                f"{_format(entries)}: entry {pos} names mesh axis {axis!r:.60}, which is not a name; mesh axis names "
                "are non-empty identifiers (letters, digits and _), as Mesh requires. Use None to replicate that dim."
            )
        return axis
    if is_int(axis):
        return int(axis)
    raise PartitionSpecTypeError(
        f"{_format(entries)}: entry {pos}: {axis!r:.80} ({type(axis).__name__}) is not a mesh axis; an entry is a "
        "mesh axis name (str), a mesh axis index (int), a tuple of those, or None (replicated)."
    )


def _normalize(entry: object, entries: tuple[object, ...], pos: int) -> SpecEntry:
    if entry is None:
        return None
    if isinstance(entry, (tuple, list)):
        axes = tuple(_check_axis(a, entries, pos) for a in entry)
        if not axes:
            return None  # JAX: an empty tuple means "not sharded"
        return axes[0] if len(axes) == 1 else axes
    return _check_axis(entry, entries, pos)


class PartitionSpec:
    """How each dim of a tensor is laid out over the mesh axes.

    Entry ``i`` describes tensor dim ``i``: a mesh axis name (``'data'``), a mesh axis index
    (``0``, as in torch_xla), a tuple of axes (the dim is split over all of them, the first
    major), or ``None`` (replicated). A spec shorter than the tensor's rank replicates the
    trailing dims, as in JAX. Mesh axes the spec does not name replicate the tensor over them
    (partial replication).

    Unlike torch_xla's bare tuples, a ``PartitionSpec`` is checked on construction, is
    immutable and hashable, and is not a tuple subclass (``P('x') != ('x',)``).

    Example:
        >>> P('data', None)
        P('data', None)
        >>> P(('data', 'fsdp'), 'model')[0]
        ('data', 'fsdp')
        >>> len(P())
        0
    """

    __slots__ = ("_entries",)
    _entries: tuple[SpecEntry, ...]

    def __init__(self, *entries: object) -> None:
        norm = tuple(_normalize(e, entries, i) for i, e in enumerate(entries))
        seen: set[AxisName] = set()
        for entry in norm:
            for axis in entry if isinstance(entry, tuple) else (entry,):
                if axis is None:
                    continue
                if axis in seen:
                    raise DuplicateAxisError(
                        f"{_format(norm)} uses mesh axis {axis!r:.80} more than once; a mesh axis can "
                        "shard at most one tensor dim. Drop one of the uses."
                    )
                seen.add(axis)
        object.__setattr__(self, "_entries", norm)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("PartitionSpec is immutable.")

    @classmethod
    def from_value(cls, spec: object) -> PartitionSpec:
        """Accept a `PartitionSpec`, or a tuple/list in torch_xla's style."""
        if isinstance(spec, PartitionSpec):
            return spec
        if isinstance(spec, (tuple, list)):
            return cls(*spec)
        raise PartitionSpecTypeError(
            f"A partition spec is a PartitionSpec or a tuple of entries, got {spec!r} "
            f"({type(spec).__name__}). Write P({spec!r}) for a one-dim spec."
        )

    @property
    def entries(self) -> tuple[SpecEntry, ...]:
        """The normalized entries."""
        return self._entries

    def mesh_axes(self) -> tuple[AxisName, ...]:
        """Every mesh axis the spec names, in order."""
        out: list[AxisName] = []
        for e in self._entries:
            if e is not None:
                out.extend(e if isinstance(e, tuple) else (e,))
        return tuple(out)

    def padded(self, rank: int) -> tuple[SpecEntry, ...]:
        """The entries padded with ``None`` to ``rank`` (no check that it is long enough)."""
        return self._entries + (None,) * (rank - len(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[SpecEntry]:
        return iter(self._entries)

    def __getitem__(self, i: int) -> SpecEntry:
        return self._entries[i]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionSpec):
            return NotImplemented
        return self._entries == other._entries

    def __hash__(self) -> int:
        return hash(("PartitionSpec", self._entries))

    def __repr__(self) -> str:
        return "P(" + ", ".join(repr(e) for e in self._entries) + ")"

    def __reduce__(self):
        return (PartitionSpec, self._entries)


def _format(entries: tuple[object, ...], limit: int = 16) -> str:
    """``P(...)`` text for a message: entries cut at 80 characters, and past ``limit`` entries the
    first ones and a count (a 100,000-entry spec made a 989,001-character message)."""
    if len(entries) <= limit:
        return "P(" + ", ".join(f"{e!r:.80}" for e in entries) + ")"
    head = ", ".join(f"{e!r:.80}" for e in entries[: limit // 2])
    return f"P({head}, ... ({len(entries) - limit // 2} more, {len(entries)} entries in all))"


P = PartitionSpec


def spec_on_largest_dim(shape: Sequence[int], axis: SpecEntry, axis_size: int) -> PartitionSpec:
    """``axis`` (a mesh axis name, or a tuple of names split over as one, ``axis_size`` devices in
    all) on the largest dim of ``shape`` it divides, else on the largest dim; ``P()`` for a
    scalar. FSDP's layout of a parameter (fsdp_xla), which the planner predicts (spmd.plan).

    >>> spec_on_largest_dim((3, 8), "fsdp", 4)
    P(None, 'fsdp')
    """
    if not shape:
        return P()
    divisible = [i for i, n in enumerate(shape) if n % axis_size == 0 and n >= axis_size]
    candidates = divisible or list(range(len(shape)))
    dim = max(candidates, key=lambda i: (shape[i], -i))
    entries: list[SpecEntry] = [None] * len(shape)
    entries[dim] = axis
    return P(*entries)
