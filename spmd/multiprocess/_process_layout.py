"""Where each process's rows sit in a global array: the pure math behind `make_global_tensor`.

A sharding cuts every tensor dim into tiles (`HloSharding.tile_shape`), and a process feeds the
tiles its devices hold. Along one dim the processes' tile sets must be equal-sized and either
disjoint or identical (JAX calls this "process-uniform"): then the distinct sets, ordered by
their first tile, number ``count``, each process feeds one of them (its ``index``), and its
local data holds ``global / count`` entries there, its tiles one after the other in tile order.
That is the layout JAX's ``make_array_from_process_local_data`` reads. A dim where the local
size equals the global one is read whole by every process (a replicated or unsplit dim, or one
split only among the process's own devices).

Nothing here touches a runtime: the device -> process map and this process's index are handed
in (`ShardingBackend.device_processes`, ``process_index``), so the math is tested for any
number of processes in one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from spmd.errors import IndivisibleBatchError, ProcessDataError
from spmd.sharding import HloSharding, ShardBounds, ShardingKind

__all__ = ["DimSlot", "ProcessLayout"]


@dataclass(frozen=True)
class DimSlot:
    """This process's part of one tensor dim.

    Attributes:
        index: which of the ``count`` distinct parts of the dim this process feeds.
        count: how many distinct parts the processes feed (1: every process feeds all of it).
        tiles: the tile positions along the dim that this process's devices hold, ascending.
        ways: the number of tiles along the dim.
    """

    index: int
    count: int
    tiles: tuple[int, ...]
    ways: int


@dataclass(frozen=True)
class ProcessLayout:
    """The tiles of ``hlo`` that process ``process`` feeds, for a tensor of ``rank`` dims.

    Attributes:
        hlo: the global tensor's sharding.
        rank: the tensor's number of dims.
        device_processes: the process of each device id (position = device id).
        process: this process's index.
        where: the call, spec and mesh, for messages.
    """

    hlo: HloSharding
    rank: int
    device_processes: tuple[int, ...]
    process: int
    where: str = ""

    @cached_property
    def devices(self) -> tuple[int, ...]:
        """The device ids this process holds, ascending."""
        return tuple(d for d, p in enumerate(self.device_processes) if p == self.process)

    @property
    def _who(self) -> str:
        count = len(set(self.device_processes))
        return (
            f"{self.where}: process {self.process} of {count}" if self.where else f"process {self.process} of {count}"
        )

    @cached_property
    def _tiles(self) -> dict[int, tuple[int, ...]]:
        """Each device's tile position (one entry per dim)."""
        if self.hlo.kind is not ShardingKind.TILED:
            return {d: (0,) * self.rank for d in range(len(self.device_processes))}
        return {int(d): tuple(int(i) for i in idx[:-1]) for idx, d in np.ndenumerate(self.hlo.tile_assignment())}

    def ways(self, dim: int) -> int:
        """The number of tiles along ``dim``."""
        return self.hlo.tile_shape[dim] if self.hlo.kind is ShardingKind.TILED else 1

    def slot(self, dim: int) -> DimSlot:
        """This process's part of ``dim``.

        Raises:
            ProcessDataError: the processes' tile sets along ``dim`` are not equal-sized and
                disjoint-or-identical, so no per-process layout exists for it.
        """
        per_process: dict[int, set[int]] = {}
        for device, tile in self._tiles.items():
            per_process.setdefault(self.device_processes[device], set()).add(tile[dim])
        distinct = sorted({frozenset(s) for s in per_process.values()}, key=min)
        sizes = {len(s) for s in distinct}
        covered = set().union(*distinct)
        if len(sizes) != 1 or sum(len(s) for s in distinct) != self.ways(dim) or covered != set(range(self.ways(dim))):
            held = {p: sorted(s) for p, s in sorted(per_process.items())}
            raise ProcessDataError(
                f"{self._who}: the processes hold tiles {held} of dim {dim} ({self.ways(dim)} tiles), which are not "
                "equal, disjoint parts of it, so each process cannot feed its own part. Pass data whose dim "
                f"{dim} is the whole dim on every process, or use a mesh whose processes hold equal blocks."
            )
        mine = frozenset(per_process[self.process])
        return DimSlot(distinct.index(mine), len(distinct), tuple(sorted(mine)), self.ways(dim))

    def global_shape(self, local_shape: tuple[int, ...], given: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The global shape for this process's ``local_shape``: ``given`` checked, or inferred
        (each dim ``local * count``, the whole dim when the process feeds all of it).

        Raises:
            ProcessDataError: ``given`` has another rank, or a dim that is neither the local
                size nor ``count`` times it.
            IndivisibleBatchError: a dim fed in parts does not split evenly over its tiles.
        """
        if given is not None and len(given) != len(local_shape):
            raise ProcessDataError(
                f"{self._who}: global_shape {tuple(given)} has {len(given)} dims, the local data {tuple(local_shape)} "
                f"has {len(local_shape)}."
            )
        out = []
        for dim, local in enumerate(local_shape):
            if given is not None and given[dim] == local:  # every process passes the whole dim
                out.append(local)
                continue
            part = self.slot(dim) if self.ways(dim) > 1 else DimSlot(0, 1, (0,), 1)
            full = local * part.count
            if given is not None and given[dim] not in (local, full):
                raise ProcessDataError(
                    f"{self._who}: dim {dim} of global_shape {tuple(given)} is {given[dim]}, but the local data "
                    f"{tuple(local_shape)} has {local} there, and this process feeds 1/{part.count} of the dim: give "
                    f"{full} (the processes' parts together) or {local} (every process holds the whole dim)."
                )
            size = full if given is None else given[dim]
            if size != local and size % part.ways:
                raise IndivisibleBatchError(
                    f"{self._who}: dim {dim} holds {local} local entries, {size} over all processes, which does not "
                    f"split into {part.ways} equal blocks (each process feeds {len(part.tiles)} of them). Make the "
                    f"global size along dim {dim} a multiple of {part.ways} (each process's part a multiple of "
                    f"{len(part.tiles)})."
                )
            out.append(size)
        return tuple(out)

    def blocks(
        self, global_shape: tuple[int, ...], local_shape: tuple[int, ...]
    ) -> dict[int, tuple[tuple[slice, ...], ShardBounds]]:
        """For each of this process's devices: the slices of the local data that device holds,
        and its block of the global array (``global_shape`` from `global_shape`)."""
        slots = {d: self.slot(d) for d in range(self.rank) if local_shape[d] != global_shape[d]}
        out = {}
        for bounds in self.hlo.shard_bounds(global_shape, self.devices):
            local = []
            for dim, whole in enumerate(bounds.index):
                if dim not in slots:
                    local.append(whole)
                    continue
                size = global_shape[dim] // slots[dim].ways
                j = slots[dim].tiles.index(bounds.tile_index[dim])
                local.append(slice(j * size, (j + 1) * size))
            out[bounds.device] = (tuple(local), bounds)
        return out

    def rows(self, dim: int, global_size: int) -> list[int]:
        """The global indices along ``dim`` this process feeds, in the order of its local data
        (what a data loader gives it), for a dim of ``global_size``.

        Raises:
            IndivisibleBatchError: ``global_size`` does not split evenly over the dim's tiles.
            ProcessDataError: the dim has no per-process layout (see `slot`).
        """
        part = self.slot(dim) if self.ways(dim) > 1 else DimSlot(0, 1, (0,), 1)
        if part.count == 1:
            return list(range(global_size))
        if global_size % part.ways:
            raise IndivisibleBatchError(
                f"{self._who}: {global_size} entries along dim {dim} (the batch, for dim 0) do not split into "
                f"{part.ways} equal blocks (this process feeds {len(part.tiles)} of them). Use a size that is a "
                f"multiple of {part.ways}."
            )
        size = global_size // part.ways
        return [i for t in part.tiles for i in range(t * size, (t + 1) * size)]
