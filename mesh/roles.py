"""Mesh roles: what each named mesh axis is for, and `ParallelDims`, the one owner of them.

A role is a parallelism that an axis of that name carries (torchtitan's ``ParallelDims`` and
MaxText's ``mesh_axes`` do the same with their own names):

- ``data``: replicas of the parameters (data parallelism; HSDP's replicate dim). Splits the batch.
- ``fsdp``: parameter shards (ZeRO-3). Splits the batch too.
- ``context``: sequence shards (context parallelism). Splits the sequence; FSDP also shards the
  parameters over it, as torchtitan does (nothing else is replicated there).
- ``tensor``: tensor parallelism (Megatron's column and row splits). Everything of the batch is
  replicated over it.

The axis order of a mesh `ParallelDims` builds is the order above: the outermost axis is the one
that communicates least (DCN across slices, when there are several), the innermost the one that
communicates most (ICI neighbours). Every rule that derives axes from roles (which axes split the
batch, which the sequence, which shard parameters) lives here and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from mesh._checks import require_int
from mesh._mesh import Mesh
from mesh.errors import MeshError, MeshTypeError

__all__ = [
    "ParallelDims",
    "Role",
    "batch_axes",
    "param_shard_axes",
    "replicate_axes",
    "sequence_axes",
    "tensor_axes",
]


class Role(StrEnum):
    """The roles a mesh axis can have; each role's axis is named by the role's value."""

    DATA = "data"
    FSDP = "fsdp"
    CONTEXT = "context"
    TENSOR = "tensor"


_ORDER = tuple(Role)
_BATCH = (Role.DATA, Role.FSDP)
_PARAM_SHARD = (Role.FSDP, Role.CONTEXT)
_SEQUENCE = (Role.CONTEXT,)
_TENSOR = (Role.TENSOR,)
_REPLICATE = (Role.DATA,)


def _present(roles: tuple[Role, ...], axis_names: Sequence[str] | None) -> tuple[str, ...]:
    names = tuple(axis_names or ())
    return tuple(str(role) for role in roles if role in names)


def batch_axes(axis_names: Sequence[str] | None) -> tuple[str, ...]:
    """The axes of ``axis_names`` that split a batch's rows (``data``, ``fsdp``), in role order."""
    return _present(_BATCH, axis_names)


def sequence_axes(axis_names: Sequence[str] | None) -> tuple[str, ...]:
    """The axes of ``axis_names`` that split the sequence (``context``)."""
    return _present(_SEQUENCE, axis_names)


def param_shard_axes(axis_names: Sequence[str] | None) -> tuple[str, ...]:
    """The axes of ``axis_names`` that FSDP shards parameters over (``fsdp``, then ``context``)."""
    return _present(_PARAM_SHARD, axis_names)


def replicate_axes(axis_names: Sequence[str] | None) -> tuple[str, ...]:
    """The axes of ``axis_names`` that hold parameter replicas (``data``: DDP, HSDP's replicate dim)."""
    return _present(_REPLICATE, axis_names)


def tensor_axes(axis_names: Sequence[str] | None) -> tuple[str, ...]:
    """The axes of ``axis_names`` that tensor parallelism splits weights over (``tensor``)."""
    return _present(_TENSOR, axis_names)


@dataclass(frozen=True)
class ParallelDims:
    """The degree of each parallelism of a job, checked once; every mesh and axis set derived.

    torchtitan's ``ParallelDims`` in our vocabulary: ``data`` x ``fsdp`` x ``context`` x
    ``tensor`` devices. A degree of 1 turns a parallelism off, and its axis is left out of the
    mesh (``fsdp`` stays, as the axis FSDP shards over, when every degree is 1).

    Example:
        >>> dims = ParallelDims(fsdp=2, context=2)
        >>> dims.world, dims.axis_names, dims.batch_axes, dims.param_shard_axes
        (4, ('fsdp', 'context'), ('fsdp',), ('fsdp', 'context'))
        >>> dims.mesh().describe()
        "mesh{'fsdp': 2, 'context': 2}"
        >>> ParallelDims.for_world(8, context=2).fsdp
        4

    Raises:
        MeshTypeError: a degree that is not an int.
        MeshError: a degree below 1.
    """

    data: int = 1
    fsdp: int = 1
    context: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        for role in _ORDER:
            degree = require_int(getattr(self, role), f"ParallelDims {role}", MeshTypeError)
            if degree < 1:
                raise MeshError(
                    f"ParallelDims {role}={degree}: a degree is the number of devices along that role's axis, "
                    "at least 1 (1 turns the parallelism off)."
                )
            object.__setattr__(self, role, degree)

    @classmethod
    def for_world(cls, world: int, *, data: int = 1, context: int = 1, tensor: int = 1) -> ParallelDims:
        """The dims of ``world`` devices with ``fsdp`` taking what the others leave (torchtitan's
        ``dp_shard=-1``).

        Raises:
            MeshError: ``world`` does not divide by ``data * context * tensor``.
        """
        world = require_int(world, "ParallelDims.for_world world", MeshTypeError, minimum=1)
        others = cls(data=data, context=context, tensor=tensor)  # checks the given degrees
        if world % others.world:
            raise MeshError(
                f"{world} devices do not divide into data {data} x context {context} x tensor {tensor} "
                f"({others.world}); pick degrees whose product divides {world}."
            )
        return cls(data=data, fsdp=world // others.world, context=context, tensor=tensor)

    @classmethod
    def from_mesh(cls, mesh: Mesh) -> ParallelDims:
        """The dims a mesh with role-named axes carries.

        Raises:
            MeshError: an axis is not named by a role, or the mesh has no axis names.
        """
        if not isinstance(mesh, Mesh):
            raise MeshTypeError(f"ParallelDims.from_mesh takes a mesh.Mesh, got {type(mesh).__name__}.")
        names = mesh.axis_names or ()
        unknown = [n for n in names if n not in _ORDER]
        if unknown or not names:
            raise MeshError(
                f"{mesh.describe()}: every axis must be named by a role ({', '.join(_ORDER)}) to read its "
                f"parallel dims; {'axes ' + repr(unknown) + ' are' if unknown else 'the mesh is'} not. "
                "Rename the axes, or build the mesh with ParallelDims(...).mesh()."
            )
        return cls(**{name: size for name, size in zip(names, mesh.mesh_shape, strict=True)})

    @property
    def world(self) -> int:
        """The device count: the product of the degrees."""
        return math.prod(getattr(self, role) for role in _ORDER)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The mesh's axes: the roles of degree > 1 in role order (``fsdp`` when none is)."""
        names = tuple(str(role) for role in _ORDER if getattr(self, role) > 1)
        return names or (str(Role.FSDP),)

    @property
    def shape(self) -> tuple[int, ...]:
        """The size of each of `axis_names`."""
        return tuple(getattr(self, name) for name in self.axis_names)

    def mesh(self, device_ids: Sequence[int] | np.ndarray | None = None) -> Mesh:
        """The mesh of these dims over ``device_ids`` (default ``0 .. world - 1``: ranks under torchrun).

        Raises:
            MeshError: ``device_ids`` holds another number of devices than `world`.
        """
        ids = np.arange(self.world) if device_ids is None else device_ids
        return Mesh(ids, self.shape, self.axis_names)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The axes that split the batch's rows."""
        return batch_axes(self.axis_names)

    @property
    def sequence_axes(self) -> tuple[str, ...]:
        """The axes that split the sequence."""
        return sequence_axes(self.axis_names)

    @property
    def param_shard_axes(self) -> tuple[str, ...]:
        """The axes FSDP shards parameters over."""
        return param_shard_axes(self.axis_names)

    @property
    def replicate_axes(self) -> tuple[str, ...]:
        """The axes that hold parameter replicas."""
        return replicate_axes(self.axis_names)
