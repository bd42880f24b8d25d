"""Which mesh axes FSDP shards parameters over, and which it replicates them over (HSDP).

``fsdp_axis`` names one mesh axis or several; several are sharded over as one, flattened in mesh
order (torchtitan shards parameters over its flattened ``dp_shard x cp`` mesh the same way), so
the stored spec puts them on one dim as a tuple: ``P(('fsdp', 'context'), None)``. They may be
given in any order, so a value derived from the mesh's roles (`mesh.roles.param_shard_axes`)
works whatever the mesh's axis order. Left out, they are the mesh's parameter-shard axes
(``fsdp``, then ``context``) of size above 1 (all of them where none is); a mesh with only
``fsdp`` therefore shards as it always did.

``replicate_axis`` names the axes that hold whole replicas of the shards (HSDP, FSDP2's 2-D
mesh): gradients are reduce-scattered over the shard axes and all-reduced over these. Left out,
they are the mesh's replicate-role axes (``data``, `mesh.roles.replicate_axes`), as torchtitan
turns HSDP on whenever its mesh has a replicate dim (of size above 1: one copy needs no
reduction, which FSDP2 would still run); ``()`` names none. Nothing is checked here
that depends on the runtime (`fsdp_xla._dtensor_fsdp` adds what FSDP2 needs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fsdp_xla.errors import FSDPTypeError, MeshAxisError
from mesh import Mesh
from mesh.roles import Role, param_shard_axes, replicate_axes

__all__ = ["AxisNames", "axis_entry", "resolve_replicate_axes", "resolve_shard_axes", "total_size"]

AxisNames = str | Sequence[str]
"""One mesh axis name, or several (a tuple, as `mesh.roles.param_shard_axes` returns)."""

_FSDP, _CONTEXT = str(Role.FSDP), str(Role.CONTEXT)


def axis_entry(axes: tuple[str, ...]) -> str | tuple[str, ...]:
    """``axes`` as one entry of a `PartitionSpec`: the name for one axis, the tuple for several
    (``()`` for none)."""
    return axes[0] if len(axes) == 1 else axes


def total_size(mesh: Mesh, axes: tuple[str, ...]) -> int:
    """How many devices ``axes`` of ``mesh`` span together (1 for none)."""
    return math.prod(mesh.axis_size(a) for a in axes)


def _sized(mesh: Mesh, axes: tuple[str, ...]) -> tuple[str, ...]:
    """``axes`` without those of size 1."""
    return tuple(a for a in axes if mesh.axis_size(a) > 1)


def _as_tuple(value: object, option: str, default: str) -> tuple[str, ...]:
    """``value`` (a name or a sequence of names) as a tuple of plain strings.

    Raises:
        FSDPTypeError: anything else (a number, a sequence holding a non-string).
    """
    if isinstance(value, str):
        return (str(value),)
    if isinstance(value, (tuple, list)) and all(isinstance(a, str) for a in value):
        return tuple(str(a) for a in value)
    raise FSDPTypeError(
        f"FSDP: {option} must be a mesh axis name, a tuple of them, or None ({default}); got {value!r:.80} "
        f"({type(value).__name__})."
    )


def _checked(mesh: Mesh, axes: tuple[str, ...], option: str, given: object) -> tuple[str, ...]:
    """``axes`` in mesh order, each an axis of ``mesh`` and none twice.

    Raises:
        MeshAxisError: an axis ``mesh`` does not have, or one named twice.
    """
    names = tuple(mesh.axis_names or ())
    for axis in axes:
        if axes.count(axis) > 1:
            once = tuple(dict.fromkeys(axes))
            raise MeshAxisError(
                f"FSDP {option}={given!r} names mesh axis {axis!r} twice; name each axis once: {option}={once!r}."
            )
        if axis not in names:
            example = f"Mesh(ids, (n, 1), ({axis!r}, 'model'))"
            raise MeshAxisError(
                f"FSDP {option}={given!r}: the mesh has no axis {axis!r}; {mesh.describe()} has axes {names}. "
                f"Name one axis {axis!r} (e.g. {example}) or pass {option}= axes of the mesh."
            )
    return tuple(sorted(axes, key=names.index))  # flattened in mesh order, as FSDP2's flattened DeviceMesh is


def resolve_shard_axes(mesh: Mesh, fsdp_axis: AxisNames | None) -> tuple[str, ...]:
    """The axes parameters are sharded over, in mesh order (see the module docstring).

    Raises:
        FSDPTypeError: ``fsdp_axis`` is not a name, a sequence of names, or None.
        MeshAxisError: an axis the mesh lacks, an axis twice, no axis at all, or (left out) a
            mesh without ``fsdp`` and ``context`` axes.
    """
    names = tuple(mesh.axis_names or ())
    if fsdp_axis is None:
        derived = param_shard_axes(names)
        if not derived:
            raise MeshAxisError(
                f"FSDP shards parameters on mesh axis {_FSDP!r} (and {_CONTEXT!r}, where the mesh has one), but "
                f"{mesh.describe()} has axes {names}. Name one axis {_FSDP!r} (e.g. Mesh(ids, (n, 1), ({_FSDP!r}, "
                "'model'))) or pass fsdp_axis=... (an axis name or a tuple of them)."
            )
        # Axes of size 1 split nothing: left out, so (fsdp 8, context 1) shards as (fsdp 8) does
        # (and a 1-device mesh keeps its axes: parameters need one to be stored over).
        return _checked(mesh, _sized(mesh, derived) or derived, "fsdp_axis", fsdp_axis)
    axes = _as_tuple(fsdp_axis, "fsdp_axis", "the mesh's parameter-shard axes")
    if not axes:
        raise MeshAxisError(
            f"FSDP fsdp_axis={fsdp_axis!r} names no mesh axis, and parameters need at least one to be sharded "
            f"over. Name axes of {mesh.describe()}, or leave fsdp_axis out for the mesh's parameter-shard axes "
            f"({param_shard_axes(names) or 'none here'})."
        )
    return _checked(mesh, axes, "fsdp_axis", fsdp_axis)


def resolve_replicate_axes(
    mesh: Mesh, replicate_axis: AxisNames | None, shard_axes: tuple[str, ...]
) -> tuple[str, ...]:
    """The axes parameters are replicated over (HSDP), in mesh order; ``()`` for none.

    Left out: the mesh's replicate-role axes that are not shard axes (an explicit ``fsdp_axis``
    naming ``data`` shards over it instead).

    Raises:
        FSDPTypeError: ``replicate_axis`` is not a name, a sequence of names, or None.
        MeshAxisError: an axis the mesh lacks, an axis twice, or an axis that is also a shard axis.
    """
    if replicate_axis is None:  # one copy on an axis of size 1: nothing to replicate or reduce over
        return _sized(mesh, tuple(a for a in replicate_axes(mesh.axis_names) if a not in shard_axes))
    axes = _checked(
        mesh, _as_tuple(replicate_axis, "replicate_axis", "the mesh's replicate axes"), "replicate_axis", replicate_axis
    )
    both = [a for a in axes if a in shard_axes]
    if both:
        rest = axis_entry(tuple(a for a in axes if a not in shard_axes))
        raise MeshAxisError(
            f"FSDP replicate_axis={replicate_axis!r} names {both[0]!r}, which FSDP shards parameters over "
            f"(fsdp_axis={axis_entry(shard_axes)!r}): an axis either splits each parameter or holds whole copies "
            f"of the shards, not both. Drop it from one of them (replicate_axis={rest!r} keeps it a shard axis)."
        )
    return axes
