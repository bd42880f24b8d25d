"""Where each parameter is stored: a PartitionSpec with the FSDP mesh axis (or axes) on one dim.

The default puts the FSDP axis on the largest dim it divides (GPT-2's ``[vocab, d]``
embedding: the vocab dim); a tensor with no such dim is split on its largest dim and XLA pads
the last shard. Scalars stay replicated. Several FSDP axes go on that dim together, as one
entry (``P(('fsdp', 'context'), None)``), and divide it by the product of their sizes. The
gathered (compute) layout is the same spec without the FSDP axes, so other mesh axes (tensor
parallelism) stay in place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from spmd import P, PartitionSpec
from spmd.errors import PartitionSpecTypeError, ShardingError
from spmd.sharding import SpecEntry
from spmd.sharding import spec_on_largest_dim as default_fsdp_spec

__all__ = ["SpecFn", "default_fsdp_spec", "spec_from_fn", "without_axis", "with_axis_on_dim"]

SpecFn = Callable[[str, torch.Tensor], PartitionSpec]
"""``(parameter name, parameter) -> stored spec`` (must name the FSDP axis, or replicate)."""


def spec_from_fn(spec_fn: SpecFn, name: str, param: torch.Tensor) -> PartitionSpec:
    """``spec_fn(name, param)`` as a `PartitionSpec`; a value that is not one names the parameter.

    Raises:
        PartitionSpecTypeError, ShardingError: what the value is, for which parameter.
    """
    value = spec_fn(name, param)
    if isinstance(value, PartitionSpec):
        return value
    try:
        return PartitionSpec.from_value(value)
    except (PartitionSpecTypeError, ShardingError) as e:
        raise type(e)(
            f"param_spec_fn returned {value!r} for parameter {name!r} of shape {tuple(param.shape)}, which is not "
            f"a partition spec: {e}"
        ) from None


def without_axis(spec: PartitionSpec, axis: SpecEntry) -> PartitionSpec:
    """``spec`` with mesh axis ``axis`` removed, or every axis of a tuple ``axis`` (the layout
    after gathering over them)."""
    removed = {axis} if isinstance(axis, str) else set(axis or ())
    out: list[SpecEntry] = []
    for entry in spec:
        if isinstance(entry, str) and entry in removed:
            out.append(None)
        elif isinstance(entry, tuple):
            rest = tuple(a for a in entry if a not in removed)
            out.append(rest if len(rest) > 1 else (rest[0] if rest else None))
        else:
            out.append(entry)
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def with_axis_on_dim(spec: PartitionSpec, rank: int, dim: int, axis: str) -> PartitionSpec:
    """``spec`` with ``axis`` added (minor-most) to tensor dim ``dim``."""
    entries = list(spec.padded(rank))
    entry = entries[dim]
    if entry is None:
        entries[dim] = axis
    elif isinstance(entry, tuple):
        entries[dim] = (*entry, axis)
    else:
        entries[dim] = (entry, axis)
    return P(*entries)
