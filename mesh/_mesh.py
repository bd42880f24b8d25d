"""`Mesh`: a logical, named n-d arrangement of device ids; a pure value, no runtime needed."""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

from mesh._checks import is_int, require_int
from mesh.errors import DeviceCountError, MeshError, MeshTypeError

__all__ = ["Mesh", "AxisRef"]

MAX_AXES = 32  # numpy arrays have at most 64 dims; no device layout needs more than a few axes

_MESH_TEXT = re.compile(r"\s*\{[\w\s'\",:\[\]()]*\}\s*")
"""What ``str(mesh)`` can print: a dict of ids, sizes and identifier names (no operators)."""

AxisRef = str | int
"""A mesh axis, by name or by index (torch_xla accepts both)."""


def _as_int_tuple(values: Iterable[object], what: str) -> tuple[int, ...]:
    out = []
    for v in values:
        if not is_int(v):
            raise MeshTypeError(f"{what} must hold integers, got {v!r} ({type(v).__name__}).")
        out.append(int(v))
    return tuple(out)


def summarize_ids(ids: Iterable[int], limit: int = 16) -> str:
    """A list of ids for a message, bounded: the first ``limit`` and how many more (a mesh of
    100,000 ids made a 689,017-character error)."""
    ids = list(ids)
    if len(ids) <= limit:
        return str(ids)
    return f"[{', '.join(map(str, ids[:limit]))}, ... ({len(ids) - limit} more, {len(ids)} in all)]"


def shape_arg(value: object, what: str) -> tuple[int, ...]:
    """A mesh shape argument as a tuple of sizes >= 1 (an int is a 1-axis shape).

    Raises:
        MeshTypeError: not an int or a sequence of ints.
        MeshError: empty, or a size below 1.
    """
    if is_int(value):
        value = (int(value),)
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        raise MeshTypeError(f"{what} must be a tuple of ints such as (4, 2), got {value!r} ({type(value).__name__}).")
    shape = _as_int_tuple(value, what)
    if not shape:
        raise MeshError(f"{what} must have at least one axis, got (); a 1-D mesh of n devices is (n,).")
    if len(shape) > MAX_AXES:
        raise MeshError(f"{what} has {len(shape)} axes; a mesh has at most {MAX_AXES}.")
    if any(s < 1 for s in shape):
        raise MeshError(f"Every size in {what} must be >= 1, got {shape}.")
    return shape


def _device_ids_arg(value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes, dict)) or value is None:
        raise MeshTypeError(f"device_ids must be a sequence or array of ints, got {value!r} ({type(value).__name__}).")
    try:
        flat = np.asarray(value, dtype=object).reshape(-1).tolist()
    except (ValueError, TypeError) as e:  # ragged nesting, or not array-like at all
        raise MeshTypeError(f"device_ids must be a flat sequence or array of ints, got {value!r}: {e}.") from None
    return _as_int_tuple(flat, "device_ids")


class Mesh:
    """A logical device mesh: device ids laid out in ``mesh_shape`` with optional axis names.

    The positional signature is torch_xla's, so ``Mesh(device_ids, (4, 2), ('data', 'model'))``
    from the PyTorch/XLA SPMD blog works unchanged. Unlike torch_xla's, a ``Mesh`` is an
    immutable value: it is validated when built, compares and hashes by value, and needs no
    runtime. The device count is checked where the mesh is used (``mark_sharding``).

    Args:
        device_ids: the device ids in row-major mesh order (any array-like of ints; it is
            flattened). Each id appears once.
        mesh_shape: the size of each mesh axis; the product must equal ``len(device_ids)``.
        axis_names: one distinct string per axis, or ``None`` for unnamed axes (then
            partition specs refer to axes by index).

    Raises:
        MeshError: the shape does not match the device count, ids repeat or are negative,
            or names repeat or do not match the rank.
        MeshTypeError: an argument has the wrong type.

    Example:
        >>> import numpy as np
        >>> mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
        >>> dict(mesh.shape())
        {'data': 4, 'model': 2}
        >>> mesh.get_logical_mesh()[1]
        array([2, 3])
    """

    # __weakref__: backends remember which meshes they derived objects for without keeping them.
    __slots__ = ("_device_ids", "_mesh_shape", "_axis_names", "_memo", "__weakref__")

    _device_ids: tuple[int, ...]
    _mesh_shape: tuple[int, ...]
    _axis_names: tuple[str, ...] | None

    def __init__(
        self,
        device_ids: Sequence[int] | np.ndarray,
        mesh_shape: Sequence[int],
        axis_names: Sequence[str] | None = None,
    ) -> None:
        shape = shape_arg(mesh_shape, "mesh_shape")
        ids = _device_ids_arg(device_ids)
        if math.prod(shape) != len(ids):
            raise MeshError(
                f"mesh_shape {shape} holds {math.prod(shape)} devices but {len(ids)} device ids "
                f"were given ({summarize_ids(ids)}). Pass a mesh_shape whose product is {len(ids)}, "
                f"e.g. ({len(ids)},)."
            )
        if any(i < 0 or i >= 2**31 for i in ids):
            bad = [i for i in ids if i < 0 or i >= 2**31]
            raise MeshError(
                f"Device ids must be >= 0 and below 2**31 (runtime device ordinals), got {summarize_ids(bad)} in "
                f"{summarize_ids(ids)}."
            )
        if len(set(ids)) != len(ids):
            seen: set[int] = set()
            dup = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
            raise MeshError(
                f"Device ids {summarize_ids(dup)} appear more than once in {summarize_ids(ids)}; each device must "
                "appear exactly once in a mesh."
            )

        names: tuple[str, ...] | None = None
        if axis_names is not None:
            if isinstance(axis_names, str):
                axis_names = (axis_names,)
            if isinstance(axis_names, (bytes, dict)) or not isinstance(axis_names, Iterable):
                raise MeshTypeError(
                    f"axis_names must be a tuple of strings such as ('data', 'model'), or None; got {axis_names!r}."
                )
            names = tuple(axis_names)
            for n in names:
                if not isinstance(n, str):
                    raise MeshTypeError(f"axis_names must be strings, got {n!r:.60} in axis_names.")
                if not n.isidentifier():
                    raise MeshError(
                        f"Mesh axis name {n!r:.60} is not a name: give a non-empty identifier (letters, digits and "
                        "'_', not starting with a digit), e.g. 'data' or 'fsdp'."
                    )
            names = tuple(str.__str__(n) for n in names)  # a StrEnum's member (`mesh.Role`) as its plain name
            if len(names) != len(shape):
                raise MeshError(
                    f"axis_names {names} has {len(names)} names but mesh_shape {shape} has "
                    f"{len(shape)} axes; give one name per axis."
                )
            if len(set(names)) != len(names):
                raise MeshError(f"axis_names must be distinct, got {names}; rename the repeated axis.")

        object.__setattr__(self, "_device_ids", ids)
        object.__setattr__(self, "_mesh_shape", shape)
        object.__setattr__(self, "_axis_names", names)
        object.__setattr__(self, "_memo", {})

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Mesh is immutable; cannot set {name!r}. Build a new Mesh instead.")

    # torch_xla-compatible accessors -------------------------------------------------------
    @property
    def device_ids(self) -> np.ndarray:
        """The device ids, flat, in row-major mesh order (a read-only array)."""
        arr = np.asarray(self._device_ids, dtype=np.int64)
        arr.flags.writeable = False
        return arr

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The size of each axis."""
        return self._mesh_shape

    @property
    def axis_names(self) -> tuple[str, ...] | None:
        """The axis names, or ``None`` for an unnamed mesh."""
        return self._axis_names

    @property
    def ndim(self) -> int:
        """The number of mesh axes."""
        return len(self._mesh_shape)

    def size(self) -> int:
        """The number of devices in the mesh."""
        return len(self._device_ids)

    def shape(self) -> OrderedDict:
        """An ``OrderedDict`` of axis name (or index, if unnamed) to axis size."""
        keys: Sequence[AxisRef] = self._axis_names or range(len(self._mesh_shape))
        return OrderedDict(zip(keys, self._mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        """The device ids as an array of shape ``mesh_shape``."""
        return np.asarray(self._device_ids, dtype=np.int64).reshape(self._mesh_shape)

    # Axis lookup ---------------------------------------------------------------------------
    def axis_index(self, axis: AxisRef) -> int:
        """The index of a mesh axis given by name or index.

        Raises:
            MeshError: the name is not an axis of this mesh or the index is out of range.
        """
        if not (isinstance(axis, str) or is_int(axis)):
            raise MeshTypeError(f"A mesh axis is a name or an int, got {axis!r}.")
        if isinstance(axis, str):
            if self._axis_names is None or axis not in self._axis_names:
                raise MeshError(
                    f"Mesh axis {axis!r} is not in {self.describe()}; use one of {list(self.shape().keys())}."
                )
            return self._axis_names.index(axis)
        if not 0 <= int(axis) < self.ndim:
            raise MeshError(f"Mesh axis index {axis} is out of range for {self.describe()}; use 0..{self.ndim - 1}.")
        return int(axis)

    def axis_size(self, axis: AxisRef) -> int:
        """The size of a mesh axis given by name or index."""
        return self._mesh_shape[self.axis_index(axis)]

    def axis_label(self, index: int) -> AxisRef:
        """The name of axis ``index``, or the index itself on an unnamed mesh.

        Raises:
            MeshError, MeshTypeError: as `axis_index`.
        """
        index = self.axis_index(index)
        return self._axis_names[index] if self._axis_names is not None else index

    def describe(self) -> str:
        """A short text such as ``mesh{'data': 4, 'model': 2}`` for error messages."""
        return "mesh{" + ", ".join(f"{k!r}: {v}" for k, v in self.shape().items()) + "}"

    def check_device_count(self, available: int, more_devices: str = "start the runtime with more devices") -> None:
        """Raise `DeviceCountError` unless the mesh uses exactly the backend's ``available``
        devices (each id below it, each once); ``more_devices`` says how to get more (the
        backend's ``more_devices``)."""
        require_int(
            available, "available", MeshTypeError, minimum=0, allowed="the runtime's device count (an int >= 0)"
        )
        missing = sorted(i for i in self._device_ids if i >= available)
        if missing:
            raise DeviceCountError(
                f"{self.describe()} uses device ids {missing}, but the runtime has only "
                f"{available} device(s) (ids 0..{available - 1}). Build the mesh over "
                f"range({available}) or run with more devices: {more_devices}."
            )
        if self.size() != available:
            raise DeviceCountError(
                f"the mesh has {self.size()} devices but the runtime has {available}; every program is partitioned "
                f"over all {available} devices, so a mesh must use each of them once. Build it over range({available})."
            )

    # torch_xla's methods ---------------------------------------------------------------------
    @property
    def memo(self) -> dict:
        """A per-object cache for what backends derive from this mesh (torch_xla's ``OpSharding``
        objects, a ``DeviceMesh``); not part of the mesh's value, never compared or pickled."""
        return self._memo

    def get_axis_name_idx(self, name: str) -> int | None:
        """The index of axis ``name``, or ``None`` if the mesh has no such axis (torch_xla's
        lookup; `axis_index` raises instead)."""
        if self._axis_names is None or name not in self._axis_names:
            return None
        return self._axis_names.index(name)

    def __str__(self) -> str:
        """torch_xla's text of a mesh, which `from_str` reads back."""
        return (
            f"{{'device_ids': {list(self._device_ids)}, 'mesh_shape': {self._mesh_shape}, "
            f"'axis_names': {self._axis_names}}}"
        )

    @classmethod
    def from_torch_xla(cls, mesh: object) -> Mesh | None:
        """The same mesh as a torch_xla ``Mesh`` (or HybridMesh): its ``device_ids``,
        ``mesh_shape`` and ``axis_names``; ``None`` if ``mesh`` is not one. Lets code that still
        builds torch_xla meshes pass them to our functions during a migration."""
        if isinstance(mesh, Mesh):
            return mesh
        if not type(mesh).__module__.startswith("torch_xla.") or not all(
            hasattr(mesh, a) for a in ("device_ids", "mesh_shape", "axis_names")
        ):
            return None
        names = None if mesh.axis_names is None else tuple(mesh.axis_names)  # type: ignore[attr-defined]
        return cls(np.asarray(mesh.device_ids).reshape(-1), tuple(mesh.mesh_shape), names)  # type: ignore[attr-defined]

    @classmethod
    def from_device_mesh(cls, device_mesh: object) -> Mesh:
        """The same mesh as a ``torch.distributed`` ``DeviceMesh``: its ranks (device ids), in its
        order and shape, with its dim names.

        Raises:
            MeshTypeError: ``device_mesh`` has no ``mesh`` of ranks (not a DeviceMesh).
        """
        ranks = getattr(device_mesh, "mesh", None)
        if not hasattr(ranks, "tolist") or not hasattr(ranks, "shape"):
            raise MeshTypeError(
                f"Mesh.from_device_mesh takes a torch.distributed DeviceMesh, got {type(device_mesh).__name__}."
            )
        names = getattr(device_mesh, "mesh_dim_names", None)
        return cls.from_ranks(ranks, None if names is None else tuple(names))

    @classmethod
    def from_ranks(cls, ranks: object, axis_names: Sequence[str] | None = None) -> Mesh:
        """A mesh of the shape of ``ranks``, an n-d array (or tensor) of device ids: e.g. what
        TorchTPU's ``torch.tpu.distributed.topology_aware_mesh(shape)`` returns, permuted so that
        mesh neighbours are ICI neighbours.

        Raises:
            MeshTypeError: ``ranks`` is not an array of ints.
        """
        values = ranks.tolist() if hasattr(ranks, "tolist") else ranks
        try:
            array = np.asarray(values)
        except ValueError as e:  # ragged nesting
            raise MeshTypeError(f"ranks must be an n-d array of device ids, got {values!r}: {e}.") from None
        if array.ndim == 0:
            raise MeshTypeError(f"ranks must be an n-d array of device ids, got the scalar {values!r}.")
        return cls(array.reshape(-1), array.shape, axis_names)

    @classmethod
    def from_str(cls, mesh_str: str) -> Mesh | None:
        """The mesh ``str(mesh)`` printed, or ``None`` if ``mesh_str`` is not such a text.

        Raises:
            MeshTypeError: ``mesh_str`` is not a string.
        """
        import ast

        if not isinstance(mesh_str, str):
            raise MeshTypeError(f"Mesh.from_str reads the text str(mesh) prints, got {type(mesh_str).__name__}.")
        text = mesh_str.replace("Mesh", "")
        if not _MESH_TEXT.fullmatch(text):  # no operators: '-' * 10**5 exhausts the parser's memory
            return None
        try:
            d = ast.literal_eval(text)
            return Mesh(d["device_ids"], d["mesh_shape"], d["axis_names"])
        except (ValueError, SyntaxError, KeyError, TypeError, MeshError, RecursionError, MemoryError):
            return None

    def get_jax_mesh(self) -> object:
        """The same mesh as a ``jax.sharding.Mesh`` over ``jax.devices()`` (ids are JAX device ids).

        Raises:
            MeshError: an id is not one of JAX's devices.
        """
        import jax

        by_id = {d.id: d for d in jax.devices()}
        missing = sorted(i for i in self._device_ids if i not in by_id)
        if missing:
            raise MeshError(f"Device ids {missing} of {self.describe()} are not JAX devices (JAX has {sorted(by_id)}).")
        devices = np.asarray([by_id[i] for i in self._device_ids], dtype=object).reshape(self._mesh_shape)
        names = self._axis_names or tuple(str(i) for i in range(self.ndim))
        return jax.sharding.Mesh(devices, names)

    # Value semantics -----------------------------------------------------------------------
    def _key(self) -> tuple:
        return (self._device_ids, self._mesh_shape, self._axis_names)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        ids = list(self._device_ids)
        iota = ids == list(range(len(ids)))
        ids_text = f"range({len(ids)})" if iota else str(ids)
        return f"Mesh(device_ids={ids_text}, mesh_shape={self._mesh_shape}, axis_names={self._axis_names})"

    def __reduce__(self):  # immutable objects still pickle (used by checkpoints)
        return (Mesh, (list(self._device_ids), self._mesh_shape, self._axis_names))
