"""One FSDP unit at run time: gather its parameters, run it, drop them, regather for backward.

The parameters are stored sharded on the FSDP mesh axis (GSPMD's layout). A unit's forward
constrains a copy of each to the gathered layout (GSPMD inserts the all-gather), swaps the
copies into the module for the call, and swaps the shards back after. Autograd would keep
the gathered copies alive until backward (matmuls save their weight); instead, a saved-tensor
hook stores a recipe, and backward regathers when the unit's output gradient arrives. The
gradient of each gathered copy is constrained back to the sharded layout, so GSPMD reduces
it across devices (a reduce-scatter).

Optimization barriers keep this from being undone by the compiler: the forward gather reads
shards that pass through a barrier with the unit's inputs, and the backward regather reads
shards that pass through a barrier with the unit's output gradient. So XLA cannot merge the
two gathers (common-subexpression elimination) nor run either before the data that needs
it exists; at most about one unit's gathered parameters are alive at a time.

What each unit traces in each phase (forward gather, backward regather, gradient reduction) runs
inside an XLA scope that names the unit and phase (`fsdp_xla._phases`), so each collective of the
compiled step can be attributed (`fsdp_xla.communication`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fsdp_xla._phases import Phase, scope_name
from fsdp_xla._units import UnitPlan
from spmd.backend import torch_xla_backend
from spmd.sharding import HloSharding
from spmd.torch_compat import autograd_engine, tree_flatten, tree_unflatten

__all__ = ["UnitConfig", "GspmdUnit", "Registry", "gather", "BACKWARD_GRAPH_NAME"]

BACKWARD_GRAPH_NAME = "FSDPForwardBackward"
"""The HLO module name of the forward+backward graph when it runs on its own."""


@contextlib.contextmanager
def _scope(phase: Phase, unit: str) -> Iterator[None]:
    """Label what is traced inside with ``unit`` and ``phase`` (HLO metadata only)."""
    handle = torch_xla_backend.push_scope(scope_name(phase, unit))
    try:
        yield
    finally:
        del handle  # releasing torch_xla's scope pusher closes the scope


class _Gather(torch.autograd.Function):
    """shard -> gathered copy in the compute dtype; gradient -> reduced to the shard layout."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        shard: torch.Tensor,
        gathered: HloSharding,
        stored: HloSharding,
        compute_dtype: torch.dtype,
        reduce_dtype: torch.dtype,
        unit: str,
    ) -> torch.Tensor:
        ctx.stored, ctx.gathered, ctx.reduce_dtype, ctx.param_dtype = stored, gathered, reduce_dtype, shard.dtype
        ctx.unit = unit
        return _constrained_copy(shard, gathered, compute_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        # First the gathered layout: each device's partial sum over its own batch shard is
        # reduced whole (XLA turns reduce + slice into a reduce-scatter where it can). A
        # direct constraint to the shard layout lets GSPMD push that layout into the
        # activation gradients instead, which then travel between devices.
        with _scope(Phase.GRADIENT_REDUCTION, ctx.unit):
            summed = _constrained_copy(grad, ctx.gathered, ctx.reduce_dtype)
            reduced = _constrained_copy(summed, ctx.stored, ctx.reduce_dtype)
            if reduced.dtype != ctx.param_dtype:
                reduced = reduced.to(ctx.param_dtype)
        return reduced, None, None, None, None, None


def _constrained_copy(t: torch.Tensor, sharding: HloSharding, dtype: torch.dtype) -> torch.Tensor:
    out = t.to(dtype) if t.dtype != dtype else t.clone()
    torch_xla_backend.attach_sharding_constraint(out, sharding)
    return out


def gather(
    shard: torch.Tensor,
    gathered: HloSharding,
    stored: HloSharding,
    compute: torch.dtype,
    reduce: torch.dtype,
    unit: str = "",
) -> torch.Tensor:
    """The gathered copy of ``shard`` (differentiable when grad mode is on; its gradient is
    reduced inside the scope of ``unit``'s gradient reduction)."""
    if torch.is_grad_enabled() and shard.requires_grad:
        return _Gather.apply(shard, gathered, stored, compute, reduce, unit)
    with torch.no_grad():
        return _constrained_copy(shard, gathered, compute)


@dataclass(frozen=True)
class UnitConfig:
    """How a unit runs (shared by the units of one FSDP root)."""

    compute_dtype: torch.dtype | None
    reduce_dtype: torch.dtype | None
    cast_inputs: bool
    reshard_after_forward: bool
    barriers: bool


@dataclass
class _Recipe:
    """What a saved-tensor hook stores instead of a gathered parameter (or a view of one)."""

    unit: GspmdUnit
    index: int
    view_fn: Callable[[torch.Tensor], torch.Tensor] | None


class Registry:
    """The gathered copies alive in the current forward, by ``id``, for the saved-tensor hooks
    of every unit of one root (an inner unit may save an outer unit's tied weight)."""

    def __init__(self, sync_after_backward: bool = False) -> None:
        self.live: dict[int, tuple[GspmdUnit, int]] = {}
        self.units: list[GspmdUnit] = []
        self.backward_pending = False
        self.sync_after_backward = sync_after_backward

    def pack(self, t: torch.Tensor) -> Any:
        hit = self.live.get(id(t))
        if hit is not None and hit[0].reshards:
            return _Recipe(hit[0], hit[1], None)
        if t._is_view() and t._base is not None:
            hit = self.live.get(id(t._base))
            if hit is not None and hit[0].reshards:
                return _Recipe(hit[0], hit[1], t._view_func)
        return t

    @staticmethod
    def unpack(saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Recipe):
            return saved
        full = saved.unit.regathered(saved.index)
        return saved.view_fn(full) if saved.view_fn is not None else full

    def end_of_backward(self) -> None:
        """Drop every unit's regathered copies (a tensor still referenced at ``sync`` time
        would become an output of the graph)."""
        for unit in self.units:
            unit.release()
        self.backward_pending = False
        if self.sync_after_backward:
            torch_xla_backend.sync_named(BACKWARD_GRAPH_NAME)


def _xla_tensors(tree: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [x for x in leaves if isinstance(x, torch.Tensor) and torch_xla_backend.is_xla_tensor(x)]


def _barrier_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``tensors`` passed through one optimization barrier together: each copy now
    depends on all the originals, and XLA cannot see through the barrier."""
    copies = [t.clone() for t in tensors]
    if copies:
        torch_xla_backend.optimization_barrier_(copies)
    return copies


class GspmdUnit:
    """The run-time state of one unit; the FSDP module's ``forward`` calls `run`."""

    def __init__(
        self,
        plan: UnitPlan,
        shardings: list[tuple[HloSharding, HloSharding]],
        config: UnitConfig,
        registry: Registry,
        checkpoint: bool,
    ) -> None:
        self.plan = plan
        self.shardings = shardings  # (stored, gathered) per slot
        self.config = config
        self.registry = registry
        self.checkpoint = checkpoint
        self._regathered: list[torch.Tensor] | None = None
        registry.units.append(self)

    @property
    def reshards(self) -> bool:
        """Whether the unit drops its gathered parameters after its forward and gathers them
        again for its backward. Not the root, as in FSDP2: its forward spans the whole model's,
        so its gathered parameters are alive until the forward ends anyway, and its backward
        begins right after (the loss in between); a regather would move them again for nothing."""
        return self.config.reshard_after_forward and self.plan.path != ""

    # Gathering ------------------------------------------------------------------------------
    def _dtypes(self, shard: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
        compute = self.config.compute_dtype if shard.is_floating_point() and self.config.compute_dtype else shard.dtype
        reduce = self.config.reduce_dtype if shard.is_floating_point() and self.config.reduce_dtype else compute
        return compute, reduce

    def _gather_all(self, shards: list[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for shard, (stored, gathered) in zip(shards, self.shardings):
            compute, reduce = self._dtypes(shard)
            out.append(gather(shard, gathered, stored, compute, reduce, self.plan.path))
        return out

    def regathered(self, index: int) -> torch.Tensor:
        """The backward copy of parameter ``index``, gathered on first use."""
        if self._regathered is None:
            self._regather(None)
        assert self._regathered is not None
        return self._regathered[index]

    def _regather(self, grad: torch.Tensor | None) -> torch.Tensor | None:
        shards = [s.param.detach() for s in self.plan.slots]
        with _scope(Phase.BACKWARD_GATHER, self.plan.path):
            if self.config.barriers and grad is not None:
                *shards, grad = _barrier_copies([*shards, grad])
            with torch.no_grad():
                self._regathered = self._gather_all(shards)
        return grad

    def release(self) -> None:
        """Forget the backward copies."""
        self._regathered = None

    def _on_output_grad(self, grad: torch.Tensor) -> torch.Tensor:
        if not self.registry.backward_pending:
            self.registry.backward_pending = True
            autograd_engine.queue_callback(self.registry.end_of_backward)
        if self._regathered is None and self.reshards:
            barriered = self._regather(grad)
            if barriered is not None:
                return barriered
        return grad

    # Swapping -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _swapped(self, fulls: list[torch.Tensor]) -> Iterator[None]:
        """Put the gathered copies where the module reads its parameters, for one call."""
        for index, (slot, full) in enumerate(zip(self.plan.slots, fulls)):
            for owner, attr in slot.owners:
                owner._parameters[attr] = full  # type: ignore[assignment]
            self.registry.live[id(full)] = (self, index)
        try:
            yield
        finally:
            for slot, full in zip(self.plan.slots, fulls):
                for owner, attr in slot.owners:
                    owner._parameters[attr] = slot.param
                self.registry.live.pop(id(full), None)

    # Running --------------------------------------------------------------------------------
    def _cast_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        dtype = self.config.compute_dtype
        if not (self.config.cast_inputs and dtype is not None):
            return args, kwargs
        leaves, spec = tree_flatten((args, kwargs))
        leaves = [
            x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype else x
            for x in leaves
        ]
        return tree_unflatten(leaves, spec)

    def run(self, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Run the unit's own ``forward`` with its parameters gathered."""
        args, kwargs = self._cast_inputs(args, kwargs)
        if self.checkpoint and torch.is_grad_enabled():
            return self._run_checkpointed(forward, args, kwargs)
        grad_mode = torch.is_grad_enabled()
        with _scope(Phase.FORWARD_GATHER, self.plan.path):
            args, kwargs, fulls = self._gather_for_forward(args, kwargs)
        reshard = grad_mode and self.reshards
        hooks = (
            torch.autograd.graph.saved_tensors_hooks(self.registry.pack, self.registry.unpack)
            if reshard
            else contextlib.nullcontext()
        )
        with self._swapped(fulls), hooks:
            out = forward(*args, **kwargs)
        if reshard:
            self.release()
        if grad_mode and self.config.reshard_after_forward:  # the root's hook ends the backward
            for t in _xla_tensors(out):
                if t.requires_grad:
                    t.register_hook(self._on_output_grad)
        return out

    def _gather_for_forward(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, list[torch.Tensor]]:
        """The unit's inputs (through the barrier) and its gathered parameters."""
        shards: list[torch.Tensor] = [s.param for s in self.plan.slots]
        if self.config.barriers:
            leaves, spec = tree_flatten((args, kwargs))
            positions = [
                i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and torch_xla_backend.is_xla_tensor(x)
            ]
            copies = _barrier_copies([leaves[i] for i in positions] + shards)
            for i, c in zip(positions, copies):
                leaves[i] = c
            args, kwargs = tree_unflatten(leaves, spec)
            shards = copies[len(positions) :]
        return args, kwargs, self._gather_all(shards)

    def _run_checkpointed(self, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Activation checkpointing of the unit: nothing is saved in forward but its inputs and
        shards; backward passes them and the output gradient through one barrier, regathers
        the parameters and recomputes (torch_xla's checkpoint)."""
        leaves, spec = tree_flatten((args, kwargs))
        positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        inputs = [leaves[i] for i in positions]
        shards = [s.param for s in self.plan.slots]

        def recompute(*tensors: torch.Tensor) -> Any:
            given = list(leaves)
            for i, t in zip(positions, tensors[: len(positions)]):
                given[i] = t
            shard_values = list(tensors[len(positions) :])
            # The first pass runs without grad (forward), the recompute with it (backward).
            phase = Phase.BACKWARD_GATHER if torch.is_grad_enabled() else Phase.FORWARD_GATHER
            with _scope(phase, self.plan.path):
                if self.config.barriers and phase is Phase.FORWARD_GATHER:
                    # Make the forward's gathers wait for the inputs, as in `run`.
                    copies = _barrier_copies(
                        [given[i] for i in positions if torch_xla_backend.is_xla_tensor(given[i])] + shard_values
                    )
                    shard_values = copies[len(copies) - len(shard_values) :]
                fulls = self._gather_all(shard_values)
            call_args, call_kwargs = tree_unflatten(given, spec)
            with self._swapped(fulls):
                return forward(*call_args, **call_kwargs)

        return torch_xla_backend.checkpoint(recompute, *inputs, *shards)
