"""Deferred init on DTensor straight into each rank's shards: no rank holds a unit's unsharded
parameters, and the weights equal those `fsdp_xla.deferred.materialize_unit` gives on GSPMD.

After ``fully_shard`` of a unit still on the meta device, each rank allocates its local shards
only. The unit's modules are then initialized as `materialize_unit` does (seeded per module,
``reset_parameters`` and the model's ``_init_weights``, or ``param_init_fn``), but against
storage-less stand-ins of the parameters' full shape (`_Recording`) that log what is done to
them. The log is replayed on the shards: a random fill (``normal_``, ``uniform_``) is drawn for
the whole parameter, a slab of rows at a time, from the same generator state, and each rank
keeps the rows and columns it holds; scalar pointwise ops (``zero_``, ``fill_``, ``mul_``, ...)
run on the shard itself (on a view such as an embedding's padding row, on the elements of the
view the shard holds). CPU draws do not depend on how a fill is split when every slab but the
last holds a multiple of 16 elements and the last at least 16 (torch's vectorized ``normal_``
works in blocks of 16 and redraws the last 16 of a tensor whose size is not a multiple; uniform
draws are one per element), which `slab_rows` guarantees; `tests/fsdp_xla/test_shard_init.py`
checks it against whole-tensor fills.

The log is taken before the unit is sharded: a unit whose init does anything else with a
parameter (reads it, copies another tensor into it, an orthogonal init, a random fill of a
view), or that has buffers on the meta device, is materialized whole on the host before
sharding, as `materialize_unit` does on GSPMD (`record_unit_init` returns None for it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fsdp_xla._units import UnitPlan
from fsdp_xla.deferred import _init_module, _unit_modules, module_seed
from spmd.torch_compat import disabled_torch_function_impl, make_wrapper_subclass, tree_map

__all__ = ["UnitRecord", "init_unit_into_shards", "record_init", "record_unit_init", "slab_rows", "stream_fill"]

_aten = torch.ops.aten
_RANDOM = {_aten.normal_.default, _aten.uniform_.default}
_POINTWISE = {
    _aten.zero_.default,
    _aten.fill_.Scalar,
    _aten.fill_.Tensor,
    _aten.mul_.Scalar,
    _aten.mul_.Tensor,
    _aten.div_.Scalar,
    _aten.div_.Tensor,
    _aten.add_.Scalar,
    _aten.add_.Tensor,
    _aten.sub_.Scalar,
    _aten.sub_.Tensor,
    _aten.clamp_.default,
    _aten.erfinv_.default,
    _aten.abs_.default,
    _aten.neg_.default,
    _aten.sqrt_.default,
}
# Slab size, in elements: one shard's worth, within these bounds (a slab is drawn, copied and
# freed; at 4 MiB glibc serves it from memory it reuses, and the RSS stays near the shards).
_MIN_SLAB = 1 << 12
_MAX_SLAB = 1 << 20


@dataclass
class _Op:
    slot: int
    func: Any
    args: tuple
    kwargs: dict
    view: tuple[tuple[int, ...], tuple[int, ...], int] | None  # (size, stride, offset); None: the whole parameter


@dataclass(frozen=True)
class UnitRecord:
    """What a unit's init does to its parameters: ``(module path, ops)`` in init order, and the
    whole shape of each parameter (by slot of the unit's plan)."""

    modules: tuple[tuple[str, tuple[_Op, ...]], ...]
    shapes: tuple[tuple[int, ...], ...]


class _Log:
    """The ops recorded so far, and the first one that cannot be replayed on shards."""

    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        self.shapes = shapes
        self.ops: list[_Op] = []
        self.unsupported: str | None = None

    def refuse(self, what: str) -> None:
        self.unsupported = self.unsupported or what


class _Recording(torch.Tensor):
    """A parameter's stand-in while its init is recorded: no storage, a CPU tensor to the init
    (torch's ``trunc_normal_`` and ``orthogonal_`` skip meta tensors, so a meta stand-in would
    record nothing), a meta tensor of the same geometry inside; ops on it are logged."""

    __torch_function__ = disabled_torch_function_impl

    @staticmethod
    def __new__(cls, meta: torch.Tensor, slot: int, log: _Log) -> _Recording:
        r = make_wrapper_subclass(
            cls, meta.shape, strides=meta.stride(), storage_offset=meta.storage_offset(), dtype=meta.dtype, device="cpu"
        )
        r._meta, r._slot, r._log = meta, slot, log
        return r

    def __repr__(self) -> str:  # the default would read the (absent) values
        return f"_Recording(slot={self._slot}, shape={tuple(self.shape)})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        flat = [*args, *kwargs.values()]
        source = next(a for a in flat if isinstance(a, _Recording))
        unwrap = lambda t: t._meta if isinstance(t, _Recording) else t  # noqa: E731
        margs, mkwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        if _is_view(func):  # a view of a parameter: still that parameter
            out = func(*margs, **mkwargs)
            wrap = lambda t: _Recording(t, source._slot, source._log) if isinstance(t, torch.Tensor) else t  # noqa: E731
            return tree_map(wrap, out)
        log = source._log
        target = args[0] if args else None
        # Another tensor's values, or a parameter's: not replayable (a 0-d tensor is a Python number).
        others = [a for a in flat if isinstance(a, torch.Tensor) and a is not target and (a.dim() or _slot(a) >= 0)]
        if func not in _RANDOM | _POINTWISE or _slot(target) < 0 or others:
            log.refuse(str(func))
            return func(*margs, **mkwargs)
        meta = target._meta
        shape = log.shapes[target._slot]
        whole = tuple(meta.shape) == shape and meta.storage_offset() == 0 and meta.is_contiguous()
        view = None if whole else (tuple(meta.shape), tuple(meta.stride()), meta.storage_offset())
        if func in _RANDOM and view is not None:
            log.refuse(f"{func} on a view")
        log.ops.append(_Op(target._slot, func, tuple(args[1:]), dict(kwargs), view))
        return target


def _slot(t: object) -> int:
    return t._slot if isinstance(t, _Recording) else -1


def record_init(
    params: list[torch.Tensor], owners: list[list[tuple[torch.nn.Module, str]]], run: Callable[[], None]
) -> _Log:
    """Run ``run`` (an init) with each of ``params`` replaced, in every ``(module, name)`` of
    ``owners``, by a `_Recording` stand-in; returns the log. An init that raises on a stand-in
    is logged as not replayable."""
    log = _Log([tuple(p.shape) for p in params])
    stand_ins = [_Recording(torch.empty_like(p, device="meta"), i, log) for i, p in enumerate(params)]
    for slot_owners, stand_in in zip(owners, stand_ins):
        for owner, attr in slot_owners:
            owner._parameters[attr] = stand_in
    try:
        with torch.no_grad():
            run()
    except Exception as e:  # e.g. a value read from a stand-in: initialize this unit whole instead
        log.refuse(f"{type(e).__name__}: {e}")
    finally:
        for slot_owners, p in zip(owners, params):
            for owner, attr in slot_owners:
                owner._parameters[attr] = p
    return log


def _is_view(func: Any) -> bool:
    """An op whose output aliases its input (``select``, ``view``, ``t``, ``detach``, ...)."""
    return any(a.alias_info is not None and not a.alias_info.is_write for a in func._schema.returns)


def slab_rows(shape: tuple[int, ...], target: int) -> list[tuple[int, int]]:
    """Row ranges ``[a, b)`` of dim 0 to fill a tensor of ``shape`` in, about ``target`` elements
    each, such that one fill per range draws what one fill of the whole does: every range but
    the last holds a multiple of 16 elements, and the last at least 16 (or the whole tensor)."""
    numel = math.prod(shape)
    rows = shape[0] if shape else 1
    if numel < 32 or rows <= 1:
        return [(0, rows)]
    per_row = numel // rows
    step = 16 // math.gcd(per_row, 16)  # rows per 16-element-aligned block
    chunk = max(step, -(-max(target, 16) // per_row) // step * step)
    ranges = []
    a = 0
    while a < rows:
        b = min(a + chunk, rows)
        if 0 < (rows - b) * per_row < 16:
            b = rows
        ranges.append((a, b))
        a = b
    return ranges


def stream_fill(
    fill: Callable[[torch.Tensor], None],
    shape: tuple[int, ...],
    dtype: torch.dtype,
    local: torch.Tensor,
    offset: tuple[int, ...],
    target: int,
) -> None:
    """Run ``fill`` over a tensor of ``shape`` a slab of rows at a time (`slab_rows`), copying the
    part each slab shares with ``local`` (the block of the whole at ``offset``) into it."""
    if not shape:
        buf = torch.empty((), dtype=dtype)
        fill(buf)
        local.copy_(buf)
        return
    lo = offset[0]
    hi = lo + local.shape[0]
    for a, b in slab_rows(shape, target):
        buf = torch.empty((b - a, *shape[1:]), dtype=dtype)
        fill(buf)
        s, e = max(a, lo), min(b, hi)
        if s >= e or local.numel() == 0:
            continue
        part = buf[s - a : e - a]
        for d in range(1, len(shape)):
            part = part.narrow(d, offset[d], local.shape[d])
        local[s - lo : e - lo].copy_(part)


def _view_indices(view: tuple[tuple[int, ...], tuple[int, ...], int], shape: tuple[int, ...]) -> torch.Tensor:
    """Flat indices into the whole parameter of the elements of ``view`` (size, stride, offset)."""
    size, stride, offset = view
    idx = torch.full(size, offset, dtype=torch.long)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape_d = [1] * len(size)
        shape_d[d] = n
        idx = idx + (torch.arange(n) * s).view(shape_d)
    return idx.reshape(-1)


def _apply_to_view(op: _Op, shape: tuple[int, ...], local: torch.Tensor, offset: tuple[int, ...]) -> None:
    """A scalar pointwise op on a view, on the elements of it this shard holds."""
    flat = _view_indices(op.view, shape)
    coords = torch.stack(torch.unravel_index(flat, shape), dim=-1) if shape else flat.view(-1, 0)
    lo = torch.tensor(offset, dtype=torch.long)
    hi = lo + torch.tensor(tuple(local.shape), dtype=torch.long)
    mine = ((coords >= lo) & (coords < hi)).all(dim=-1)
    if not bool(mine.any()):
        return
    local_coords = coords[mine] - lo
    strides = torch.tensor(local.stride(), dtype=torch.long)
    where = (local_coords * strides).sum(dim=-1)
    flat_local = local.view(-1)  # FSDP2's shards are contiguous
    values = flat_local[where].clone()
    op.func(values, *op.args, **op.kwargs)
    flat_local[where] = values


def record_unit_init(
    root: torch.nn.Module,
    plan: UnitPlan,
    unit_paths: list[str],
    init_fn: Callable[[torch.nn.Module], None] | None,
    seed: int,
) -> UnitRecord | None:
    """What `materialize_unit` would do to ``plan``'s parameters (still on the meta device),
    recorded without allocating them; None if it cannot be replayed on shards (module docstring)."""
    if any(b is not None and b.is_meta for _, owner, attr in plan.buffers for b in [owner._buffers[attr]]):
        return None
    params = [slot.param for slot in plan.slots]
    if not all(p.is_meta for p in params):
        return None
    owners = [list(slot.owners) for slot in plan.slots]
    modules = []
    with torch.random.fork_rng(devices=[]):
        for path, module in _unit_modules(root, plan, unit_paths):
            log = record_init(
                params, owners, lambda path=path, module=module: _init_module(root, path, module, init_fn, seed)
            )
            if log.unsupported is not None:
                return None
            modules.append((path, tuple(log.ops)))
    return UnitRecord(tuple(modules), tuple(tuple(p.shape) for p in params))


def _allocate_shards(plan: UnitPlan, modules: list[torch.nn.Module], device: str) -> None:
    """Each rank's local shards, allocated (not initialized); buffers stay as they are."""

    def empty_if_meta(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device=device) if t.is_meta else t

    for m in modules:
        if m is not plan.module and any(p.is_meta for p in m.parameters(recurse=False)):
            m._apply(empty_if_meta, recurse=False)
    plan.module._apply(empty_if_meta, recurse=False)  # FSDPModule._apply re-registers the unit's shards


def _local_block(p: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The local tensor of DTensor ``p`` and its offset in the whole."""
    from torch.distributed.tensor import DTensor

    from spmd.torch_compat import compute_local_shape_and_global_offset

    if not isinstance(p, DTensor):
        return p.data, (0,) * p.dim()
    _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return p._local_tensor, tuple(offset)


def init_unit_into_shards(
    root: torch.nn.Module, plan: UnitPlan, unit_paths: list[str], record: UnitRecord, seed: int, device: str
) -> None:
    """Allocate ``plan``'s local shards (the unit has been ``fully_shard``-ed on the meta
    device) and replay ``record`` (from `record_unit_init`) on them."""
    _allocate_shards(plan, [m for _, m in _unit_modules(root, plan, unit_paths)], device)
    blocks = []
    for slot in plan.slots:
        owner, attr = slot.owners[0]
        blocks.append(_local_block(owner._parameters[attr]))
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for path, ops in record.modules:
            torch.manual_seed(module_seed(seed, path))
            for op in ops:
                _replay(op, record.shapes[op.slot], *blocks[op.slot])


def _replay(op: _Op, shape: tuple[int, ...], local: torch.Tensor, offset: tuple[int, ...]) -> None:
    if op.func in _RANDOM:
        fill = lambda buf: op.func(buf, *op.args, **op.kwargs)  # noqa: E731
        stream_fill(fill, shape, local.dtype, local, offset, max(_MIN_SLAB, min(local.numel(), _MAX_SLAB)))
    elif op.view is None:
        op.func(local, *op.args, **op.kwargs)
    else:
        _apply_to_view(op, shape, local, offset)
