"""`HloSharding`: XLA's sharding of one array as a pure value (numpy only, no torch_xla).

It prints as XLA's HLO text (``{devices=[4,1,2]0,1,...,7 last_tile_dim_replicate}``), parses
that text back (the explicit device list that torch_xla prints and the iota form
``<=[4,2]T(1,0)`` that JAX prints), and answers which block of a global array each device
holds, with the padding XLA adds when a dim does not divide evenly.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mesh.checks import is_int, summarize_ids
from spmd.errors import HloShardingError, SpmdTypeError

__all__ = ["ShardingKind", "HloSharding", "ShardBounds", "iota_device_ids"]


class ShardingKind(enum.Enum):
    """The three sharding kinds of the GSPMD paper that a (mesh, spec) can give, and manual
    (inside an `enable_manual_sharding` region, where GSPMD leaves the value alone)."""

    REPLICATED = "replicated"
    MAXIMAL = "maximal"
    TILED = "tiled"
    MANUAL = "manual"


@dataclass(frozen=True)
class ShardBounds:
    """The block of the global array that one device holds.

    Attributes:
        device: the device id.
        tile_index: the block's position in the tile grid (one entry per tensor dim).
        index: slices into the global array (the unpadded block).
        padded_shape: the block's shape on the device, including XLA's padding.
        replica_id: which copy this is among devices holding the same block (0-based).
    """

    device: int
    tile_index: tuple[int, ...]
    index: tuple[slice, ...]
    padded_shape: tuple[int, ...]
    replica_id: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The unpadded block shape."""
        return tuple(s.stop - s.start for s in self.index)

    @property
    def padding(self) -> tuple[int, ...]:
        """Padding elements at the end of each dim."""
        return tuple(p - s for p, s in zip(self.padded_shape, self.shape))


_MAX_DEVICES = 1 << 20  # more devices than any pod; bounds the work a malformed text can ask for
_MAX_DEVICE_ID = 2**31  # runtime device ordinals are int32, as `Mesh` checks
_MAX_TILE_DIMS = 63  # numpy's 64 dims, less the replication dim of the tile assignment


def _int_tuple(value: object, what: str, fix: str) -> tuple[int, ...]:
    """``value`` as a tuple of ints, or SpmdTypeError naming ``what``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise SpmdTypeError(f"{what} is a tuple of ints, got {value!r:.200} ({type(value).__name__}). {fix}")
    items = list(value)
    bad = [v for v in items if not is_int(v)]
    if bad:
        raise SpmdTypeError(f"{what} is a tuple of ints; {bad[0]!r:.80} ({type(bad[0]).__name__}) is not. {fix}")
    return tuple(int(v) for v in items)


def _check_device_ids(devices: tuple[int, ...], what: str) -> None:
    bad = [d for d in devices if not 0 <= d < _MAX_DEVICE_ID]
    if bad:
        raise HloShardingError(
            f"{what}: device ids are >= 0 and below 2**31 (runtime device ordinals), got {summarize_ids(bad)} in "
            f"{summarize_ids(devices)}."
        )


def _int_list(text: str, where: str) -> list[int]:
    parts = text.split(",")
    if not all(p.isdigit() and len(p) <= 9 for p in parts):
        raise HloShardingError(f"{where}: {text[:80]!r} is not a list of integers such as 4,2.")
    return [int(p) for p in parts]


def iota_device_ids(text: str, count: int | None = None, where: str = "") -> np.ndarray:
    """The device ids XLA's iota form ``<=[a,b,...]`` or ``<=[a,b]T(1,0)`` stands for, flat.

    The one reader of that form (shardings and the collectives' replica groups use it).

    Raises:
        HloShardingError: malformed, not ``count`` ids, or the T(...) is not a permutation.
    """
    if not isinstance(text, str):
        raise HloShardingError(f"An iota device list is text such as '<=[4,2]T(1,0)', got {type(text).__name__}.")
    where = where or f"iota {text[:80]!r}"
    m = re.fullmatch(r"<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", text.strip())
    if m is None:
        raise HloShardingError(f"Malformed iota device list in {where}; write it as <=[a,b]T(1,0).")
    reshape = _int_list(m.group(1), where)
    total = math.prod(reshape)
    if not 0 < total <= _MAX_DEVICES or (count is not None and total != count):
        raise HloShardingError(
            f"{where}: the iota <=[{m.group(1)}] has {total} ids, {count or 'at most ' + str(_MAX_DEVICES)} expected."
        )
    ids = np.arange(total).reshape(reshape)
    if m.group(2):
        perm = _int_list(m.group(2), where)
        if sorted(perm) != list(range(len(reshape))):
            raise HloShardingError(f"{where}: T({m.group(2)}) is not a permutation of the iota's {len(reshape)} axes.")
        ids = ids.transpose(perm)
    return ids.reshape(-1)


@dataclass(frozen=True)
class HloSharding:
    """One array's XLA sharding.

    Attributes:
        kind: replicated, maximal (one device holds it all) or tiled.
        tile_shape: for tiled, the number of blocks along each tensor dim.
        devices: for tiled, the tile assignment flattened row-major over
            ``tile_shape + (replication,)``; for maximal, the one device.
        replication: devices holding each block (``> 1`` is XLA's ``last_tile_dim_replicate``).
    """

    kind: ShardingKind
    tile_shape: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    replication: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ShardingKind):
            raise SpmdTypeError(
                f"HloSharding's kind is a ShardingKind (e.g. ShardingKind.TILED), got {self.kind!r:.80} "
                f"({type(self.kind).__name__}). Or build one with HloSharding.tiled/.replicated/.maximal/.parse."
            )
        fix = "Build it with HloSharding.tiled(array of device ids) or HloSharding.parse(text)."
        object.__setattr__(self, "tile_shape", _int_tuple(self.tile_shape, "tile_shape", fix))
        object.__setattr__(self, "devices", _int_tuple(self.devices, "devices", fix))
        if not is_int(self.replication):
            raise SpmdTypeError(f"replication is an int >= 1, got {self.replication!r:.80}. {fix}")
        object.__setattr__(self, "replication", int(self.replication))
        if self.kind is ShardingKind.TILED:
            self._check_tiled()
        elif self.tile_shape or self.replication != 1:
            raise HloShardingError(
                f"A {self.kind.value} sharding has no tile shape or replication, got tile_shape={self.tile_shape}, "
                f"replication={self.replication}. Use HloSharding.{self.kind.value}()."
            )
        if self.kind is ShardingKind.MAXIMAL and len(self.devices) != 1:
            raise HloShardingError(f"A maximal sharding names one device, got {summarize_ids(self.devices)}.")
        if self.kind in (ShardingKind.REPLICATED, ShardingKind.MANUAL) and self.devices:
            raise HloShardingError(
                f"A {self.kind.value} sharding names no devices, got {summarize_ids(self.devices)}. "
                f"Use HloSharding.{self.kind.value}()."
            )
        _check_device_ids(self.devices, f"{self.kind.value} sharding")

    def _check_tiled(self) -> None:
        if not 1 <= len(self.tile_shape) <= _MAX_TILE_DIMS or any(t < 1 for t in self.tile_shape):
            raise HloShardingError(
                f"A tiled sharding has 1 to {_MAX_TILE_DIMS} tile dims (one per tensor dim), each >= 1 block; got "
                f"tile_shape {self.tile_shape!s:.200} ({len(self.tile_shape)} dims). A scalar or an unsharded array is HloSharding.replicated()."
            )
        if self.replication < 1:
            raise HloShardingError(f"replication counts the devices holding each block (>= 1), got {self.replication}.")
        if len(set(self.devices)) != len(self.devices):
            raise HloShardingError(
                f"A tiled sharding names each device once; {summarize_ids(self.devices)} repeats some. Check the device list."
            )
        need = math.prod(self.tile_shape) * self.replication
        if need != len(self.devices):
            raise HloShardingError(
                f"Tile shape {self.tile_shape} x replication {self.replication} needs {need} "
                f"devices, got {len(self.devices)}."
            )

    # Constructors --------------------------------------------------------------------------
    @classmethod
    def replicated(cls) -> HloSharding:
        """Every device holds the whole array."""
        return cls(ShardingKind.REPLICATED)

    @classmethod
    def manual(cls) -> HloSharding:
        """Each device holds its own value and GSPMD does not partition it (XLA's ``{manual}``)."""
        return cls(ShardingKind.MANUAL)

    @classmethod
    def maximal(cls, device: int) -> HloSharding:
        """One device holds the whole array."""
        if not is_int(device):
            raise SpmdTypeError(
                f"A maximal sharding's device is an int id, got {device!r:.80} ({type(device).__name__})."
            )
        return cls(ShardingKind.MAXIMAL, devices=(int(device),))

    @classmethod
    def tiled(cls, tile_assignment: np.ndarray, replicate_last_dim: bool = False) -> HloSharding:
        """From an n-d array of device ids; with ``replicate_last_dim`` its last axis lists the
        devices that hold the same block. Replication groups are stored sorted (their order
        does not matter to XLA; torch_xla prints them sorted)."""
        arr = np.asarray(tile_assignment)
        if arr.dtype.kind not in "iu":
            raise SpmdTypeError(
                f"A tile assignment is an array of int device ids, got dtype {arr.dtype} ({arr.reshape(-1)[:8]}...)."
            )
        if not isinstance(replicate_last_dim, bool):
            raise SpmdTypeError(f"replicate_last_dim takes True or False, got {replicate_last_dim!r:.80}.")
        if arr.ndim < 1 + replicate_last_dim:
            raise HloShardingError(
                f"A tile assignment has one axis per tensor dim{' plus the replication axis' * replicate_last_dim}; "
                f"got a {arr.ndim}-d array. A scalar or an unsharded array is HloSharding.replicated()."
            )
        if replicate_last_dim:
            tile_shape, replication = arr.shape[:-1], arr.shape[-1]
            arr = np.sort(arr, axis=-1)
        else:
            tile_shape, replication = arr.shape, 1
        return cls(
            ShardingKind.TILED, tuple(int(s) for s in tile_shape), tuple(arr.reshape(-1).tolist()), int(replication)
        )

    # Text form -----------------------------------------------------------------------------
    def __str__(self) -> str:
        if self.kind is ShardingKind.REPLICATED:
            return "{replicated}"
        if self.kind is ShardingKind.MANUAL:
            return "{manual}"
        if self.kind is ShardingKind.MAXIMAL:
            return f"{{maximal device={self.devices[0]}}}"
        dims = list(self.tile_shape) + ([self.replication] if self.replication > 1 else [])
        text = "{devices=[" + ",".join(map(str, dims)) + "]" + ",".join(map(str, self.devices))
        return text + (" last_tile_dim_replicate}" if self.replication > 1 else "}")

    _TILED_RE = re.compile(
        r"^\{devices=\[(?P<dims>[0-9,]+)\]\s*(?P<devs>[0-9,]+|<=\[[0-9,]+\](?:T\([0-9,]+\))?)"
        r"(?P<rep>\s+last_tile_dim_replicate)?\}$"
    )

    @classmethod
    def parse(cls, text: str) -> HloSharding:
        """Parse XLA's HLO sharding text, explicit or iota device lists.

        Raises:
            HloShardingError: the text is not a replicated, manual, maximal or (partially)
                tiled sharding (a ``ValueError``).
        """
        if not isinstance(text, str):
            raise HloShardingError(f"HloSharding.parse reads text such as '{{replicated}}', got {type(text).__name__}.")
        t = text.strip()
        if t == "{replicated}":
            return cls.replicated()
        if t == "{manual}":
            return cls.manual()
        m = re.fullmatch(r"\{maximal device=(\d+)\}", t)
        if m:
            return cls.maximal(int(m.group(1)))
        m = cls._TILED_RE.match(t)
        if not m:
            raise HloShardingError(
                f"Not an HLO sharding this parser knows: {text[:200]!r}. It reads '{{replicated}}', '{{manual}}', "
                "'{maximal device=N}' and '{devices=[a,b,...]ids...[ last_tile_dim_replicate]}' (ids listed or "
                "as an iota '<=[n]T(...)'), as torch_xla and JAX print them."
            )
        where = f"HLO sharding {text[:200]!r}"
        dims = _int_list(m.group("dims"), where)
        if len(dims) > _MAX_TILE_DIMS + 1:
            raise HloShardingError(
                f"{where} has {len(dims)} tile dims; a sharding has at most {_MAX_TILE_DIMS} (one per tensor dim) "
                "and a replication dim."
            )
        count = math.prod(dims)
        if not 0 < count <= _MAX_DEVICES or 0 in dims:
            raise HloShardingError(f"{where} tiles over {count} devices; a sharding names 1..{_MAX_DEVICES}.")
        devs = m.group("devs")
        if devs.startswith("<="):
            flat = iota_device_ids(devs, count, where)
        else:
            flat = np.asarray(_int_list(devs, where))
            if flat.size != count:
                raise HloShardingError(f"{where} lists {flat.size} device ids for tiles {dims} of {count} devices.")
        return cls.tiled(flat.reshape(dims), replicate_last_dim=bool(m.group("rep")))

    def map_devices(self, ids: Sequence[int]) -> HloSharding:
        """Replace device ``i`` by ``ids[i]`` (JAX writes positions in the mesh's device list)."""
        if self.kind in (ShardingKind.REPLICATED, ShardingKind.MANUAL):
            return self
        new = _int_tuple(ids, "map_devices' ids", "Give one device id per position, e.g. mesh.device_ids.tolist().")
        _check_device_ids(new, "map_devices' ids")
        if self.devices and max(self.devices) >= len(new):
            raise HloShardingError(
                f"{self._label()} names devices up to {max(self.devices)}, but map_devices got {len(new)} ids "
                f"{summarize_ids(new)}; give at least {max(self.devices) + 1}, one per position."
            )
        if self.kind is ShardingKind.MAXIMAL:
            return HloSharding.maximal(new[self.devices[0]])
        arr = np.asarray(new, dtype=np.int64)[np.asarray(self.devices)].reshape(self._assignment_shape())
        return HloSharding.tiled(arr, replicate_last_dim=self.replication > 1)

    def _label(self) -> str:
        """The HLO text, cut short for a message (a sharding of a pod lists thousands of ids)."""
        text = str(self)
        return text if len(text) <= 200 else f"{text[:200]}... ({len(self.devices)} devices)"

    # Geometry ------------------------------------------------------------------------------
    def _assignment_shape(self) -> tuple[int, ...]:
        return self.tile_shape + ((self.replication,) if self.replication > 1 else ())

    def tile_assignment(self) -> np.ndarray:
        """Device ids of shape ``tile_shape + (replication,)`` (tiled shardings only)."""
        if self.kind is not ShardingKind.TILED:
            raise HloShardingError(f"{self._label()} has no tile assignment.")
        return np.asarray(self.devices, dtype=np.int64).reshape(self.tile_shape + (self.replication,))

    @property
    def is_replicated(self) -> bool:
        """Every device holds the whole array."""
        return self.kind is ShardingKind.REPLICATED

    def shard_bounds(self, global_shape: Sequence[int], devices: Sequence[int]) -> list[ShardBounds]:
        """The block each of ``devices`` holds of an array of ``global_shape``, in that order.

        A dim of size ``n`` split ``k`` ways gives every device ``ceil(n / k)`` elements; the
        last blocks are cut short (or empty) and XLA pads them, as GSPMD does.
        """
        fix = "Pass the array's shape, e.g. (8, 4), and the device ids, e.g. [0, 1, 2, 3]."
        shape = _int_tuple(global_shape, "shard_bounds' global_shape", fix)
        devices = _int_tuple(devices, "shard_bounds' devices", fix)
        if any(n < 0 for n in shape):
            raise HloShardingError(f"A global shape has sizes >= 0, got {shape!s:.200}. {fix}")
        if self.kind is ShardingKind.MANUAL:
            raise HloShardingError("A {manual} value has no global layout: each device holds its own block.")
        if self.kind is not ShardingKind.TILED:
            _check_device_ids(devices, "shard_bounds' devices")
            full = tuple(slice(0, s) for s in shape)
            return [ShardBounds(d, (0,) * len(shape), full, shape, i) for i, d in enumerate(devices)]
        if len(self.tile_shape) != len(shape):
            raise HloShardingError(
                f"{self._label()} tiles {len(self.tile_shape)} dims; the array {shape} has {len(shape)}."
            )
        assignment = self.tile_assignment()
        where = {int(d): idx for idx, d in np.ndenumerate(assignment)}
        per_tile = [-(-n // k) for n, k in zip(shape, self.tile_shape)]  # exact: no float rounding past 2**53
        out = []
        for d in devices:
            if int(d) not in where:
                raise HloShardingError(f"Device {d} is not in the tile assignment of {self._label()}.")
            *tile, replica = where[int(d)]
            index = tuple(slice(min(t * p, n), min((t + 1) * p, n)) for t, p, n in zip(tile, per_tile, shape))
            out.append(ShardBounds(int(d), tuple(tile), index, tuple(per_tile), int(replica)))
        return out
