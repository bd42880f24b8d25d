"""`HybridMesh`: an ICI x DCN mesh for multi-slice pods, and the device ordering behind it.

Ordering (the rule the tests pin down):

1. Devices are grouped by ``slice_index`` (slices in increasing index order); each slice is
   one DCN "granule".
2. Inside a slice, devices are laid out on their physical grid by ``coords`` (x, y, z) and,
   on chips with several cores, ``core_on_chip``. The logical ICI axes are given whole
   physical axes by JAX's rule (``jax.experimental.mesh_utils.create_device_mesh``, which
   torch_xla's ``HybridMesh`` also follows): from the last logical axis to the first, each
   takes the first lexicographic combination of the most free physical axes whose sizes
   multiply to its size; so a logical axis is a physical ring/torus line (or plane). When no
   such assignment exists, the devices in physical row-major order are reshaped (physical
   axes are split). Devices without ``coords`` (CPU, GPU) are ordered by id.
3. The per-slice ICI meshes are tiled over the DCN mesh so that mesh axis ``i`` has size
   ``dcn[i] * ici[i]`` with the DCN index major (JAX's ``create_hybrid_device_mesh``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mesh._checks import require_int
from mesh._mesh import Mesh, shape_arg
from mesh.errors import MeshError, MeshTypeError

__all__ = ["DeviceInfo", "HybridMesh", "hybrid_device_order"]


@dataclass(frozen=True)
class DeviceInfo:
    """What the mesh needs to know of a device: its id and where it sits.

    Attributes:
        id: the runtime device id (ordinal).
        coords: physical chip coordinates (x, y, z) on TPU; ``None`` where unknown.
        core_on_chip: the core index within the chip (TPU v2/v3 have 2 cores per chip).
        slice_index: the slice (DCN granule) the device belongs to.
    """

    id: int
    coords: tuple[int, ...] | None = None
    core_on_chip: int = 0
    slice_index: int = 0

    def __post_init__(self) -> None:
        """Every field an int >= 0 (numpy ints become ints); ``coords`` a sequence of them.

        Raises:
            MeshTypeError: a field is not an int (or ``coords`` not ints).
            MeshError: a field is negative.
        """
        for name in ("id", "core_on_chip", "slice_index"):
            object.__setattr__(self, name, _count(getattr(self, name), f"DeviceInfo.{name}"))
        if self.coords is not None:
            if isinstance(self.coords, (str, bytes, Mapping)) or not isinstance(self.coords, Iterable):
                raise MeshTypeError(
                    f"DeviceInfo.coords must be a tuple of ints (x, y, z) or None, got {self.coords!r:.60}."
                )
            object.__setattr__(self, "coords", tuple(_count(c, "DeviceInfo.coords") for c in self.coords))

    @classmethod
    def from_attributes(cls, device_id: int, attributes: Mapping[str, object]) -> DeviceInfo:
        """Build from one entry of torch_xla's ``global_runtime_device_attributes()``.

        The id is the ordinal in the entry's ``name`` (``"TPU:3"`` is device 3) when it has one,
        as torch_xla reads it; the list's order need not be the ordinal order.

        Raises:
            MeshTypeError: ``attributes`` is not a dict, or an attribute is not an int (a list of ints for ``coords``).
        """
        if not isinstance(attributes, Mapping):
            raise MeshTypeError(f"attributes must be a dict of device attributes, got {type(attributes).__name__}.")
        coords = attributes.get("coords")
        name = attributes.get("name")
        if isinstance(name, str) and name.rsplit(":", 1)[-1].isdigit():
            device_id = int(name.rsplit(":", 1)[-1])
        try:
            return cls(
                id=device_id,  # type: ignore[arg-type]
                coords=coords,  # type: ignore[arg-type]
                core_on_chip=attributes.get("core_on_chip", 0),  # type: ignore[arg-type]
                slice_index=attributes.get("slice_index", 0),  # type: ignore[arg-type]
            )
        except (MeshTypeError, MeshError) as e:
            raise type(e)(f"device attributes {_bounded(attributes)}: {e}") from None


def _count(value: object, what: str) -> int:
    value = require_int(value, what, MeshTypeError)
    if value < 0:
        raise MeshError(f"{what} must be >= 0, got {value}.")
    return value


def _bounded(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _devices_arg(devices: object) -> list[DeviceInfo]:
    """``devices`` as a non-empty list of `DeviceInfo`.

    Raises:
        MeshTypeError: not a list or tuple of DeviceInfo.
        MeshError: empty.
    """
    if not isinstance(devices, (list, tuple)) or not all(isinstance(d, DeviceInfo) for d in devices):
        raise MeshTypeError(f"devices must be a list of mesh.DeviceInfo, got {_bounded(devices)}.")
    if not devices:
        raise MeshError("HybridMesh needs at least one device; devices=[] was given.")
    return list(devices)


def _physical_grid(devices: Sequence[DeviceInfo]) -> np.ndarray:
    """Device ids placed on their physical grid: axes (x, y, z), plus a core axis when a chip has
    several cores. Size-1 axes are kept (they take part in the axis assignment, as in JAX)."""
    if any(d.coords is None for d in devices):
        return np.asarray(sorted(d.id for d in devices), dtype=np.int64)
    ndim = len(devices[0].coords)  # type: ignore[arg-type]
    if any(len(d.coords) != ndim for d in devices):  # type: ignore[arg-type]
        raise MeshError(
            f"Devices of one slice give coords of different lengths ({sorted({len(d.coords) for d in devices})}); "  # type: ignore[arg-type]
            "every device needs (x, y, z)."
        )
    with_core = any(d.core_on_chip != 0 for d in devices)
    positions = [tuple(d.coords) + ((d.core_on_chip,) if with_core else ()) for d in devices]  # type: ignore[operator]
    rank = ndim + int(with_core)
    lo = [min(p[k] for p in positions) for k in range(rank)]
    extent = [max(p[k] for p in positions) - lo[k] + 1 for k in range(rank)]
    if int(np.prod(extent)) != len(devices):
        raise MeshError(
            f"The {len(devices)} devices of a slice do not fill their bounding box {tuple(extent)} "
            "(coords x, y, z, core); a slice must be a full rectangular block of chips."
        )
    grid = np.full(extent, -1, dtype=np.int64)
    for d, p in zip(devices, positions):
        grid[tuple(p[k] - lo[k] for k in range(rank))] = d.id
    if (grid < 0).any():
        raise MeshError("Two devices share the same coords and core_on_chip; check the topology.")
    return grid


def _assign_whole_axes(phys_shape: tuple[int, ...], logical: tuple[int, ...]) -> list[int] | None:
    """A transpose of the physical axes that gives each logical axis whole physical axes, or
    ``None`` when there is none.

    JAX's rule (``mesh_utils.create_device_mesh``): logical axes are served from the last (the
    most network-intensive by convention) to the first; each takes the first combination, in
    lexicographic order, of as many still-free physical axes as possible (3, then 2, then 1)
    whose sizes multiply to its size. Physical axes nobody took (size 1) go last.
    """
    free = list(phys_shape)
    assignment: list[tuple[int, ...]] = [() for _ in logical]
    for axis in reversed(range(len(logical))):
        for count in range(min(3, len(free)), 0, -1):
            pick = next(
                (
                    c
                    for c in itertools.combinations(range(len(free)), count)
                    if np.prod([free[i] for i in c]) == logical[axis]
                ),
                None,
            )
            if pick is not None:
                assignment[axis] = pick
                for i in pick:
                    free[i] = 0  # taken: no product with it matches any size again
                break
        else:
            if logical[axis] > 1:
                return None
    order = [i for a in assignment for i in a]
    return order + [i for i in range(len(phys_shape)) if i not in order]


def ici_device_order(devices: Sequence[DeviceInfo], ici_mesh_shape: Sequence[int]) -> np.ndarray:
    """The devices of one slice as an array of shape ``ici_mesh_shape`` (rule 2 above)."""
    shape = tuple(int(s) for s in ici_mesh_shape)
    if int(np.prod(shape)) != len(devices):
        raise MeshError(
            f"ici_mesh_shape {shape} holds {int(np.prod(shape))} devices but a slice has "
            f"{len(devices)}; its product must equal the devices per slice."
        )
    grid = _physical_grid(devices)
    perm = _assign_whole_axes(grid.shape, shape)
    if perm is not None:
        grid = grid.transpose(perm)
    return grid.reshape(shape)


def hybrid_device_order(
    devices: Sequence[DeviceInfo], ici_mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int]
) -> np.ndarray:
    """Device ids as an array of shape ``dcn * ici`` (elementwise), per the module's rules.

    Raises:
        MeshTypeError: a shape is not ints, or ``devices`` not a list of `DeviceInfo`.
        MeshError: a size below 1, or shapes that do not fit the devices and their slices.
    """
    devices = _devices_arg(devices)
    ici = shape_arg(ici_mesh_shape, "ici_mesh_shape")
    dcn = shape_arg(dcn_mesh_shape, "dcn_mesh_shape")
    if len(ici) != len(dcn):
        raise MeshError(
            f"ici_mesh_shape {ici} and dcn_mesh_shape {dcn} must have the same number of axes; "
            "pad the shorter one with 1s."
        )
    slices: dict[int, list[DeviceInfo]] = {}
    for d in devices:
        slices.setdefault(d.slice_index, []).append(d)
    granules = [slices[k] for k in sorted(slices)]
    if int(np.prod(dcn)) != len(granules):
        raise MeshError(
            f"dcn_mesh_shape {dcn} asks for {int(np.prod(dcn))} slices but the devices come from "
            f"{len(granules)} slice(s) (slice_index values {sorted(slices)})."
        )
    per_slice = [ici_device_order(g, ici) for g in granules]
    granule_grid = np.arange(len(granules)).reshape(dcn)
    blocks = np.empty(dcn, dtype=object)
    for idx in np.ndindex(*dcn):
        blocks[idx] = per_slice[granule_grid[idx]]
    return np.block(blocks.tolist()) if len(dcn) > 0 else per_slice[0]


class HybridMesh(Mesh):
    """A mesh over ICI-connected devices within slices and DCN between slices.

    Axis ``i`` has size ``ici_mesh_shape[i] * dcn_mesh_shape[i]``; order axes by increasing
    network intensity (e.g. ``('data', 'fsdp', 'tensor')``) and put the slice count on the
    outermost (data) axis of ``dcn_mesh_shape``.

    Args:
        ici_mesh_shape: the logical mesh within one slice.
        dcn_mesh_shape: the logical mesh of slices; default all 1s (one slice).
        axis_names: one name per axis.
        devices: the devices to lay out (``spmd.HybridMesh`` takes the backend's when they are
            not given: ``coords``, ``core_on_chip`` and ``slice_index`` from torch_xla's device
            attributes).

    Example:
        >>> devs = [DeviceInfo(i, slice_index=i // 4) for i in range(8)]  # 2 slices of 4
        >>> m = HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1),
        ...                axis_names=("data", "fsdp"), devices=devs)
        >>> m.get_logical_mesh().tolist()
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    """

    __slots__ = ("_ici_mesh_shape", "_dcn_mesh_shape")

    def __init__(
        self,
        *,
        ici_mesh_shape: Sequence[int],
        dcn_mesh_shape: Sequence[int] | None = None,
        axis_names: Sequence[str] | None = None,
        devices: Sequence[DeviceInfo] | None = None,
    ) -> None:
        ici = shape_arg(ici_mesh_shape, "ici_mesh_shape")
        dcn = shape_arg(dcn_mesh_shape, "dcn_mesh_shape") if dcn_mesh_shape is not None else (1,) * len(ici)
        if devices is None:
            raise MeshTypeError(
                "mesh.HybridMesh needs devices= (a Mesh is a value; it does not ask a runtime). spmd.HybridMesh "
                "takes the runtime's devices, or describe them: [DeviceInfo(id, coords=..., slice_index=...), ...]."
            )
        order = hybrid_device_order(devices, ici, dcn)
        super().__init__(order.reshape(-1), tuple(a * b for a, b in zip(ici, dcn)), axis_names)
        object.__setattr__(self, "_ici_mesh_shape", ici)
        object.__setattr__(self, "_dcn_mesh_shape", dcn)

    @property
    def ici_mesh_shape(self) -> tuple[int, ...]:
        """The mesh within one slice."""
        return self._ici_mesh_shape

    @property
    def dcn_mesh_shape(self) -> tuple[int, ...]:
        """The mesh of slices."""
        return self._dcn_mesh_shape
