"""Per-process data loading: each process loads only its rows of every global batch, in an order
fixed by a seed, from a position a checkpoint can save.

The global batches do not depend on the number of processes: epoch ``e``'s order is a
permutation of the dataset drawn from ``(seed, e)``, global batch ``b`` is its slice
``[b * B, (b + 1) * B)``, and a process loads the rows of that batch its devices hold
(`spmd.process_rows`). So every row of an epoch is loaded exactly once across the processes
(``drop_last`` leaves out the ``len % B`` rows after the last full batch), one process on 8
devices sees the batches 4 processes see, and a run resumed from a saved `DataPosition`
(even with another process count) sees exactly what the uninterrupted run would have.

`ProcessSampler` gives the dataset indices; `ProcessDataLoader` loads them, collates them and
makes each process's rows one global batch (`spmd.make_global_tensor` / `make_global_batch`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import torch

from mesh import Mesh
from mesh.checks import is_int, require_bool, require_int
from spmd._backend import backend_for
from spmd._backend.agreement import agree
from spmd.errors import DataPositionError, ProcessDataError, SpmdTypeError
from spmd.multiprocess._process_data import global_batch, global_tensor, process_rows
from spmd.sharding import PartitionSpec, SpecEntry

__all__ = ["DataPosition", "ProcessSampler", "ProcessDataLoader"]

SpecLike = PartitionSpec | Sequence[SpecEntry]


@dataclass(frozen=True)
class DataPosition:
    """Where a `ProcessSampler` is: the next batch to load, and what the order depends on.

    Attributes:
        epoch: the current epoch (0-based).
        batch: the next batch of that epoch.
        seed: the seed of the order.
        dataset_size: rows in the dataset.
        global_batch: rows per global batch.
        shuffle: whether each epoch's order is a permutation (else the dataset's order).
        drop_last: whether the rows after the last full batch are left out.
    """

    epoch: int
    batch: int
    seed: int
    dataset_size: int
    global_batch: int
    shuffle: bool
    drop_last: bool

    def __post_init__(self) -> None:
        """Each field checked as its type says (a ``'no'`` shuffle would read as ``True``, a negative
        epoch fails inside numpy's generator at the next epoch, a float batch as an index)."""
        for name, minimum in (("epoch", 0), ("batch", 0), ("seed", 0), ("dataset_size", 1), ("global_batch", 1)):
            value = require_int(
                getattr(self, name),
                f"DataPosition.{name}",
                SpmdTypeError,
                minimum=minimum,
                range_error=DataPositionError,
            )
            object.__setattr__(self, name, value)  # numpy's ints as Python's
        for name in ("shuffle", "drop_last"):
            require_bool(getattr(self, name), f"DataPosition.{name}", SpmdTypeError)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (for ``save_sharded(..., extra={"data": ...})``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, value: object) -> DataPosition:
        """The position `to_dict` wrote.

        Raises:
            DataPositionError: not a dict with these fields and types.
        """
        names = {f.name: f.type for f in fields(cls)}
        if not isinstance(value, Mapping) or set(value) != set(names):
            raise DataPositionError(
                f"A saved data position is a dict with keys {sorted(names)}, got {str(value)[:200]}. Was it written by "
                "ProcessSampler.state_dict()?"
            )
        for name, kind in names.items():
            wanted = bool if kind in ("bool", bool) else int
            if not (isinstance(value[name], bool) if wanted is bool else is_int(value[name])):
                raise DataPositionError(
                    f"Saved data position field {name!r} is {value[name]!r:.60}, not an {wanted.__name__}: the saved "
                    "state was edited or is not ProcessSampler.state_dict()'s. Save it again from the sampler."
                )
        negative = [n for n in ("epoch", "batch", "seed") if int(value[n]) < 0]
        if negative:  # numpy's generator refuses a negative seed part with a traceback of its own
            raise DataPositionError(
                f"Saved data position field {negative[0]!r} is {value[negative[0]]}, below 0: the saved state was "
                "edited or is not ProcessSampler.state_dict()'s. Save it again from the sampler."
            )
        return cls(**{n: value[n] if isinstance(value[n], bool) else int(value[n]) for n in names})  # numpy ints too


def _count(value: object, what: str, minimum: int) -> int:
    return require_int(value, what, ProcessDataError, minimum=minimum)


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):  # a string such as 'no' or 'False' is truthy: it would turn it on
        raise SpmdTypeError(f"{what} takes True or False, got {value!r:.60} ({type(value).__name__}).")
    return bool(value)


SAME_ORDER = (
    "Build the loader alike on every rank: the same dataset (length), global batch, seed, shuffle and drop_last, "
    "and load the same saved position into each; else the ranks load batches of different epochs or orders."
)


class ProcessSampler:
    """The dataset indices this process loads for each global batch (see the module docstring).

    Args:
        dataset_size: rows in the dataset.
        global_batch: rows per global batch (all processes together).
        rows: which positions of a global batch of a given size this process loads (a function
            of the size, e.g. ``lambda n: spmd.process_rows(mesh, P("data"), n)``); ``None``:
            all of them (one process).
        seed: the seed of the order.
        shuffle: permute each epoch (else the dataset's order every epoch).
        drop_last: leave out the rows after the last full batch (else a last, shorter batch).

    Raises:
        IndivisibleBatchError: a batch (the last short one included) does not split over the
            processes' devices.
    """

    def __init__(
        self,
        dataset_size: int,
        global_batch: int,
        rows: Callable[[int], Sequence[int]] | None = None,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        self.dataset_size = _count(dataset_size, "dataset_size", 1)
        self.global_batch = _count(global_batch, "global_batch", 1)
        self.seed = _count(seed, "seed", 0)
        self.shuffle, self.drop_last = _flag(shuffle, "shuffle"), _flag(drop_last, "drop_last")
        if self.global_batch > self.dataset_size and self.drop_last:
            raise ProcessDataError(
                f"global_batch {global_batch} is larger than the dataset ({dataset_size} rows): with drop_last=True no "
                "batch would be loaded. Use a smaller batch or drop_last=False."
            )
        if rows is not None and not callable(rows):
            raise SpmdTypeError(
                f"rows is a function of the batch size giving this process's positions (e.g. lambda n: "
                f"spmd.process_rows(mesh, P('data'), n)), or None for one process; got {rows!r:.60}."
            )
        self._per_process = rows is not None
        self._rows = rows or (lambda n: range(n))
        self._positions = {n: list(self._rows(n)) for n in self._batch_sizes()}
        self._epoch, self._batch = 0, 0

    def _batch_sizes(self) -> set[int]:
        tail = self.dataset_size % self.global_batch
        return {self.global_batch} | ({tail} if tail and not self.drop_last else set())

    def __len__(self) -> int:
        """Global batches per epoch."""
        full, tail = divmod(self.dataset_size, self.global_batch)
        return full + (1 if tail and not self.drop_last else 0)

    def order(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s order of the dataset's rows (the same in every process)."""
        if not self.shuffle:
            return np.arange(self.dataset_size)
        return np.random.default_rng([self.seed, epoch]).permutation(self.dataset_size)

    def indices(self, epoch: int, batch: int) -> list[int]:
        """The dataset indices this process loads for global batch ``batch`` of ``epoch``."""
        start = batch * self.global_batch
        members = self.order(epoch)[start : start + self.global_batch]
        return [int(members[i]) for i in self._positions[len(members)]]

    def __iter__(self) -> Iterator[list[int]]:
        """The rest of the current epoch, batch by batch; the position moves as each is handed
        out, and to the next epoch after the last.

        Raises:
            RankDisagreementError: on every process, when this sampler feeds one process of several
                (``rows`` given) and the processes' samplers differ in what the order depends on
                or where they are (one small collective per epoch, at its start).
        """
        if self._per_process:
            agree(backend_for(None), "ProcessSampler epoch", self.position.to_dict(), SAME_ORDER)
        while self._batch < len(self):
            indices = self.indices(self._epoch, self._batch)
            self._batch += 1
            yield indices
        self._epoch, self._batch = self._epoch + 1, 0

    @property
    def position(self) -> DataPosition:
        """The next batch to load, with what the order depends on."""
        return DataPosition(
            self._epoch, self._batch, self.seed, self.dataset_size, self.global_batch, self.shuffle, self.drop_last
        )

    def state_dict(self) -> dict[str, Any]:
        """The position as plain JSON values."""
        return self.position.to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved position (saved with any process count).

        Raises:
            DataPositionError: it was saved for another dataset size, batch, seed or order.
        """
        saved = DataPosition.from_dict(state)
        mine = self.position
        for name in ("dataset_size", "global_batch", "seed", "shuffle", "drop_last"):
            if getattr(saved, name) != getattr(mine, name):
                raise DataPositionError(
                    f"The saved data position has {name}={getattr(saved, name)!r}, this sampler {getattr(mine, name)!r}: "
                    "it would load other batches than the saved run. Build the sampler as the saved run did."
                )
        if not 0 <= saved.batch <= len(self):
            raise DataPositionError(
                f"The saved data position's batch {saved.batch} is outside 0..{len(self)} (the batches of an epoch "
                "of this sampler): it was edited or saved by another loader. Load the position the sampler saved."
            )
        self._epoch, self._batch = saved.epoch, saved.batch


def _batch_spec(specs: Mapping[str, SpecLike] | SpecLike) -> PartitionSpec:
    """The spec of the batch dim (dim 0), which every key must share."""
    values = [PartitionSpec.from_value(s) for s in specs.values()] if isinstance(specs, Mapping) else [specs]
    firsts = {(tuple(PartitionSpec.from_value(s)) or (None,))[0] for s in values}
    if len(firsts) != 1:
        raise ProcessDataError(
            f"The specs {dict(specs)} split the batch dim (dim 0) differently; a loader gives each process one set "
            "of rows, so every key's spec must split dim 0 the same way."
        )
    return PartitionSpec(firsts.pop())


class ProcessDataLoader:
    """Loads this process's rows of each global batch and returns the global batch.

    Args:
        dataset: a map-style dataset (``len`` and ``dataset[i]``).
        global_batch: rows per global batch.
        mesh: the mesh; ``None`` uses the global mesh.
        specs: the batch's spec, or a spec per key for dict rows (their dim 0 entries agree).
        seed: the seed of the order (`ProcessSampler`).
        shuffle: permute each epoch (`ProcessSampler`).
        drop_last: leave out the rows after the last full batch (`ProcessSampler`).
        collate_fn: makes the loaded rows one local batch (``torch.utils.data.default_collate``).
        check_shapes: check every batch that all processes loaded the same shapes (one small
            collective per batch; see `make_global_tensor`).

    Iterating gives the rest of the current epoch, each batch a global tensor (or dict of
    them); `state_dict` / `load_state_dict` save and restore the position.
    """

    def __init__(
        self,
        dataset: Any,
        global_batch: int,
        mesh: Mesh | None,
        specs: Mapping[str, SpecLike] | SpecLike,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        check_shapes: bool = True,
    ) -> None:
        batch_dim = _batch_spec(specs)
        self.check_shapes = _flag(check_shapes, "check_shapes")
        if collate_fn is not None and not callable(collate_fn):
            raise SpmdTypeError(f"collate_fn is a function of a list of rows, or None; got {collate_fn!r:.60}.")
        if isinstance(dataset, (str, bytes)) or not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise SpmdTypeError(
                f"ProcessDataLoader: dataset must be a map-style dataset (len(dataset) and dataset[i]), got "
                f"{type(dataset).__name__}. Wrap an iterable in a list, or give a torch.utils.data.Dataset."
            )
        self.dataset, self.mesh, self.specs = dataset, mesh, specs
        self.sampler = ProcessSampler(
            len(dataset),
            global_batch,
            lambda n: process_rows(mesh, batch_dim, n),
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        self.collate_fn = collate_fn or torch.utils.data.default_collate

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        for indices in self.sampler:
            # The ranks agree on the position of every batch in the exchange that checks its shapes.
            at = self.sampler.position.to_dict()
            at["batch"] -= 1  # the batch just handed out
            local = self.collate_fn([self.dataset[i] for i in indices])
            if isinstance(local, Mapping):
                yield global_batch(local, self.mesh, self.specs, self.check_shapes, at)
            elif isinstance(self.specs, Mapping):
                raise ProcessDataError(
                    f"specs is a dict ({sorted(self.specs)}) but the collated batch is a {type(local).__name__}; "
                    "give one spec for a tensor batch, or rows that collate to a dict."
                )
            else:
                yield global_tensor(local, self.mesh, self.specs, None, self.check_shapes, at)

    def state_dict(self) -> dict[str, Any]:
        """The position (see `ProcessSampler.state_dict`)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved position (see `ProcessSampler.load_state_dict`)."""
        self.sampler.load_state_dict(state)
