"""The world a dry run gives a script: rank ``r`` of ``N`` on torch.distributed's fake process
group, in one process, with no devices.

- The environment torchrun would set (``RANK``, ``WORLD_SIZE``...), so a script that checks it
  (ours launch their own ranks outside torchrun) runs as one rank of a job.
- ``init_process_group("fake", store=FakeStore())`` before the script runs; the script's own
  ``init_process_group`` (gloo, NCCL, ``spmd.init_process_group``) then finds the group made and
  keeps it: the collectives it issues complete at once, moving nothing (or, on real tensors,
  copying as if every rank sent what this one does).
- Device meshes are built outside the fake tensor mode: a mesh's rank ids are topology that
  ``DeviceMesh`` reads back (``tolist``), not data a rank holds, and a fake tensor has no values.
- ``model.to(device)`` works on a model built in the mode (`_swap_fake`).
- A ``DataLoader``'s workers run in this process (`_loader_in_process`): a worker is a process of
  its own, which would get the fake tensors pickled (refused: a meta tensor's storage set to
  CPU's) and not the fake world. The batches are the same; ``worker_init_fn`` does not run and
  ``get_worker_info()`` is None, as with ``num_workers=0``.
- ``cpu:0`` is ``cpu``, as for real tensors (`_cpu_without_index`): the fake mode keeps the index,
  and then refuses ``cpu`` and ``cpu:0`` in one op (the Trainer puts its batches on ``cpu:0``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["fake_world"]


def _torchrun_env(world: int, rank: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "spmd-inspector-dry-run",
    }


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _real_tensors(fn: Any) -> Any:
    """``fn`` run with the fake tensor mode set aside (its tensors are real)."""
    from spmd._util.torch_compat import unset_fake_temporarily

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return fn(*args, **kwargs)

    return run


def _keep_fake_group(original: Any) -> Any:
    """``init_process_group`` that keeps the fake group made already: the script's call asks for
    a group of this world, which it has."""

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            original(*args, **kwargs)

    return init_process_group


# Collectives of Python objects pickle them into tensors and read the bytes back: real tensors
# there, which the fake group (every rank as this one) copies as a real group would.
_OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")
# Likewise spmd's check that every rank called mark_sharding (and the others) alike: the ranks
# exchange digests of their arguments and compare them. On fake tensors the digests read back
# as placeholders, listed as the script's own reads of a value, which they are not.
_OUR_EXCHANGES = (("spmd._backend.dtensor_processes", "all_process_values"),)


class _Chunks(Sequence):
    """``torch.chunk(tensor, n, dim)`` padded with empty tensors to ``n``, each made when read.

    FSDP2's ``_chunk_with_empty`` makes all ``n`` (a view per chunk, ``new_empty(0)`` for each
    rank past the last) and reads two: this rank's and the first. Under the fake mode each costs
    about 0.2 ms: 58,000 of them, most of a dry run's time, for a small GPT at 1,024 ranks."""

    def __init__(self, tensor: Any, n: int, dim: int) -> None:
        self._tensor, self._n, self._dim = tensor, n, dim
        size = tensor.size(dim)
        self._step = -(-size // n) if size else 0  # torch.chunk's chunk size
        self._count = -(-size // self._step) if self._step else 0

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        i = i + self._n if i < 0 else i
        if not 0 <= i < self._n:
            raise IndexError(i)
        if self._count == 0:  # an empty dim: torch.chunk's own answer (cheap: nothing to split)
            import torch

            chunks = list(torch.chunk(self._tensor, self._n, dim=self._dim))
            return chunks[i] if i < len(chunks) else chunks[0].new_empty(0)
        if i >= self._count:
            return self._tensor.new_empty(0)
        start = i * self._step
        return self._tensor.narrow(self._dim, start, min(self._step, self._tensor.size(self._dim) - start))


def _chunk_with_empty(tensor: Any, num_chunks: int, dim: int) -> _Chunks:
    return _Chunks(tensor, num_chunks, dim)


def _swap_fake(original: Any) -> Any:
    """``torch.utils.swap_tensors`` that can swap fake tensors.

    ``Module._apply`` (``.to``, ``.cuda``, ``.float``) swaps every fake parameter in place, and
    ``swap_tensors`` refuses any tensor something holds a weak reference to; the fake mode's own
    memo (``MetaConverter.tensor_memo``, a ``WeakValueDictionary``) holds one to every fake tensor
    it made. So in torch 2.15 ``nn.Linear(4, 4).to("cpu")`` fails inside any ``FakeTensorMode``
    ("Couldn't swap Linear.weight"; pytorch/pytorch#148977, #170781; the fixes proposed upstream
    are not merged). The memo only caches the conversion of a tensor that is gone (the meta
    tensor it was made from), so its entries for the two tensors are dropped before the swap;
    any other weak reference is still refused, as a real run refuses it."""

    @functools.wraps(original)
    def swap_tensors(t1: Any, t2: Any) -> None:
        for tensor in (t1, t2):
            _forget_in_fake_memo(tensor)
        original(t1, t2)

    return swap_tensors


def _forget_in_fake_memo(tensor: Any) -> None:
    import weakref

    from spmd._util.torch_compat import FakeTensor

    if not isinstance(tensor, FakeTensor):
        return
    memo = tensor.fake_mode.fake_tensor_converter.tensor_memo
    # Keys only: a list of the references themselves would keep them alive through the swap.
    keys = [ref.key for ref in weakref.getweakrefs(tensor) if isinstance(ref, weakref.KeyedRef)]
    for key in keys:
        if memo.get(key) is tensor:
            del memo[key]


def _loader_in_process(original: Any) -> Any:
    """``DataLoader._get_iterator`` that iterates in this process whatever its ``num_workers``
    (the loader's own single-process iterator, made while the loader reads as one without
    workers: it checks ``num_workers`` and ``timeout`` are 0). The iterator draws a seed for its
    workers as it is made (``.item()`` of a random tensor): drawn real, it is no read of the
    script's."""

    @functools.wraps(original)
    def get_iterator(loader: Any) -> Any:
        from spmd._util.torch_compat import SingleProcessDataLoaderIter, unset_fake_temporarily

        saved = loader.num_workers, loader.timeout
        object.__setattr__(loader, "num_workers", 0)
        object.__setattr__(loader, "timeout", 0)
        try:
            with unset_fake_temporarily():  # the iterator draws its workers' seed: a real value
                return SingleProcessDataLoaderIter(loader)
        finally:
            object.__setattr__(loader, "num_workers", saved[0])
            object.__setattr__(loader, "timeout", saved[1])

    return get_iterator


def _cpu_without_index(original: Any) -> Any:
    """``FakeTensor._normalize_fake_device`` that drops a CPU device's index, as a real CPU tensor
    does (``torch.zeros(1, device="cpu:0").device`` is ``cpu``)."""

    @functools.wraps(original)
    def normalize(device: Any) -> Any:
        device = original(device)
        if device.type == "cpu" and device.index is not None:
            import torch

            return torch.device("cpu")
        return device

    return normalize


def _fake_device_patches() -> list[tuple[Any, str, Any]]:
    from spmd._util.torch_compat import FakeTensor

    found = FakeTensor.__dict__.get("_normalize_fake_device")
    if not isinstance(found, staticmethod):
        return []
    return [(FakeTensor, "_normalize_fake_device", staticmethod(_cpu_without_index(found.__func__)))]


def _fsdp_patches() -> list[tuple[Any, str, Any]]:
    """`_chunk_with_empty` where FSDP2 looks it up (each module imported it by name)."""
    import importlib

    found = []
    for name in ("_fsdp_common", "_fsdp_param"):
        module = importlib.import_module(f"torch.distributed.fsdp._fully_shard.{name}")
        if "_chunk_with_empty" in module.__dict__:
            found.append((module, "_chunk_with_empty", _chunk_with_empty))
    return found


def _patches() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for each function the dry run replaces."""
    import importlib

    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import torch.utils
    from torch.distributed import distributed_c10d

    mesh_class = device_mesh.DeviceMesh
    found = [(torch.utils, "swap_tensors", _swap_fake(torch.utils.swap_tensors))]
    for owner in (dist, distributed_c10d):
        found.append((owner, "init_process_group", _keep_fake_group(owner.init_process_group)))
        for name in _OBJECT_COLLECTIVES:
            found.append((owner, name, _real_tensors(getattr(owner, name))))
    found += [
        (device_mesh, "init_device_mesh", _real_tensors(device_mesh.init_device_mesh)),
        (mesh_class, "__init__", _real_tensors(mesh_class.__init__)),
    ]
    for module_name, name in _OUR_EXCHANGES:
        owner = importlib.import_module(module_name)
        found.append((owner, name, _real_tensors(getattr(owner, name))))
    ranks = mesh_class.__dict__.get("mesh")
    if isinstance(ranks, property):  # torch 2.15 makes a mesh's rank tensor anew at each read
        found.append((mesh_class, "mesh", property(_real_tensors(ranks.fget))))
    for name in ("_concatenate", "_flatten", "_unflatten"):  # build new meshes from old ones
        static = mesh_class.__dict__.get(name)
        if isinstance(static, staticmethod):
            found.append((mesh_class, name, staticmethod(_real_tensors(static.__func__))))
        elif static is not None:
            found.append((mesh_class, name, _real_tensors(static)))
    from torch.utils.data import DataLoader

    found.append((DataLoader, "_get_iterator", _loader_in_process(DataLoader._get_iterator)))
    return found + _fsdp_patches() + _fake_device_patches()


@contextmanager
def fake_world(world: int, rank: int) -> Iterator[None]:
    """Be rank ``rank`` of ``world`` on the fake process group inside the block; the group is
    destroyed and every replaced function restored after it."""
    import torch.distributed as dist

    from spmd._util.torch_compat import FakeProcessGroup, FakeStore

    with _environment(_torchrun_env(world, rank)):
        if dist.is_initialized():
            dist.destroy_process_group()
        options = FakeProcessGroup.Options()
        options.simulate_uniform_ranks = True  # every rank sends what this one does
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore(), pg_options=options)
        patches = _patches()
        saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        try:
            yield
        finally:
            for owner, name, original in reversed(saved):
                setattr(owner, name, original)
            if dist.is_initialized():
                dist.destroy_process_group()
            _forget_shardings()


def _forget_shardings() -> None:
    """Drop DTensor's cached sharding decisions: they hold meshes whose process groups were just
    destroyed, and the next rank's run (``--ranks all``) reuses the group names."""
    from spmd._util.torch_compat import clear_dtensor_sharding_caches

    clear_dtensor_sharding_caches()
