"""Which ranks of a job can differ in a dry run, and so which `--ranks worst` runs.

Every rank runs the same program on tensors of the same global shapes and placements (SPMD);
what differs between ranks is the local shape of each sharded tensor, a function of the rank's
coordinate on the mesh: ``Shard(d)`` gives ``ceil(size / n)`` rows to the first coordinates and
fewer (or none) to the last when ``n`` does not divide ``size``. Ranks whose every DTensor has
the same local shape run the same ops on the same shapes: the same memory and the same bytes
sent. So the ranks are grouped by the local shapes of the DTensors a run meets (parameters,
inputs, activations, gradients, optimizer state: every DTensor an op takes), and one rank of
each group stands for it. What this cannot see: a script that branches on its rank (``if rank
== 0: evaluate()``); rank 0 is always run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from spmd._util.torch_compat import TorchDispatchMode

__all__ = ["ShardShapes", "noting_shard_shapes"]


def _uneven(shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: tuple[Any, ...]) -> bool:
    """Whether some tensor dim does not divide by the ranks splitting it (then ranks differ)."""
    ways: dict[int, int] = {}
    for mesh_dim, placement in enumerate(placements):
        dim = getattr(placement, "dim", None)  # Shard and _StridedShard
        if isinstance(dim, int):
            ways[dim] = ways.get(dim, 1) * mesh_shape[mesh_dim]
    return any(shape[dim] % n for dim, n in ways.items())


class ShardShapes(TorchDispatchMode):
    """A dispatch mode that notes the layout (global shape, placements, mesh) of every unevenly
    split DTensor an op takes, and lets DTensor run the op; `groups` then says which ranks hold
    the same local shapes of all of them."""

    def __init__(self) -> None:
        super().__init__()
        self._meshes: dict[int, Any] = {}  # id -> mesh, kept alive so that no id is reused
        self._layouts: set[tuple[tuple[int, ...], tuple[Any, ...], int]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        from torch.distributed.tensor import DTensor

        if not any(issubclass(t, DTensor) for t in types):
            return func(*args, **(kwargs or {}))
        from spmd._util.torch_compat import tree_flatten

        for value in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(value, DTensor):
                self._note(value)
        return NotImplemented

    def _note(self, t: Any) -> None:
        mesh, shape, placements = t.device_mesh, tuple(t.shape), tuple(t.placements)
        if _uneven(shape, tuple(mesh.shape), placements):
            self._meshes.setdefault(id(mesh), mesh)
            self._layouts.add((shape, placements, id(mesh)))

    def groups(self, world: int) -> tuple[tuple[int, ...], ...]:
        """The ranks ``0..world-1`` grouped by the local shapes of every layout noted (each group
        in rank order, the groups by their first rank); one group when every split was even."""
        from spmd._util.torch_compat import local_shape_at_coordinate as _compute_local_shape_and_global_offset

        signatures: list[list[Any]] = [[] for _ in range(world)]
        coordinates = {key: _coordinates(mesh) for key, mesh in self._meshes.items()}
        for shape, placements, key in sorted(self._layouts, key=repr):
            mesh_shape, where = coordinates[key]
            for rank in range(world):
                coordinate = where.get(rank)
                local = None
                if coordinate is not None:
                    local = _compute_local_shape_and_global_offset(
                        shape, mesh_shape, list(coordinate), placements, skip_offset=True
                    )[0]
                signatures[rank].append(local)
        grouped: dict[tuple[Any, ...], list[int]] = {}
        for rank, signature in enumerate(signatures):
            grouped.setdefault(tuple(signature), []).append(rank)
        return tuple(tuple(ranks) for ranks in grouped.values())


def _coordinates(mesh: Any) -> tuple[tuple[int, ...], dict[int, tuple[int, ...]]]:
    """(mesh shape, {rank: its coordinate}) of a DeviceMesh (read outside any fake mode)."""
    from spmd._util.torch_compat import unset_fake_temporarily

    with unset_fake_temporarily():
        ranks = mesh.mesh.tolist()
        shape = tuple(mesh.shape)
    flat = _flatten(ranks)
    where = {}
    for index, rank in enumerate(flat):
        coordinate, rest = [], index
        for size in reversed(shape):
            coordinate.append(rest % size)
            rest //= size
        where[int(rank)] = tuple(reversed(coordinate))
    return shape, where


def _flatten(nested: Any) -> list[int]:
    return [r for item in nested for r in _flatten(item)] if isinstance(nested, list) else [nested]


@contextmanager
def noting_shard_shapes(enabled: bool) -> Iterator[ShardShapes | None]:
    """A `ShardShapes` around the block when ``enabled``, else nothing."""
    if not enabled:
        yield None
        return
    with ShardShapes() as shapes:
        yield shapes
