"""`optimization_barrier`: XLA's barrier that keeps the compiler from merging work across it."""

from __future__ import annotations

import torch

from spmd._backend import backend
from spmd.errors import NotAnXlaTensorError

__all__ = ["optimization_barrier", "apply_backward_optimization_barrier"]


def optimization_barrier(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Pass ``tensors`` through one XLA optimization barrier and return them.

    XLA may not move computation across the barrier nor common-subexpression-eliminate a value
    computed before it with one computed after it. fsdp_xla uses it so the backward re-gather
    of parameters is not merged with the forward gather. The tensors are updated in place
    (their traced values now come out of the barrier) and returned for convenience.

    Raises:
        NotAnXlaTensorError: a tensor is not on an XLA device.
    """
    flat = list(tensors)
    for i, t in enumerate(flat):
        if not isinstance(t, torch.Tensor) or not backend.is_xla_tensor(t):
            where = f"on '{t.device}'" if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"
            raise NotAnXlaTensorError(
                f"optimization_barrier: argument {i} is {where}; every argument must be an XLA tensor."
            )
    if flat:
        backend.optimization_barrier_(flat)
    return tuple(flat)


def apply_backward_optimization_barrier(module: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
    """Put an optimization barrier over ``module``'s parameter gradients and input gradients in
    backward (torch_xla's function of this name).

    XLA then cannot fuse this module's backward with its neighbours', which keeps it from
    allocating one large buffer for all of their gradients at once. Returns the hook's handle.
    """

    def barrier(mod: torch.nn.Module, grad_input: tuple, grad_output: tuple) -> None:
        grads = [p.grad for p in mod.parameters() if p.grad is not None]
        flat = [g for g in grads + list(grad_input) if isinstance(g, torch.Tensor)]
        if flat:
            backend.optimization_barrier_(flat)

    return module.register_full_backward_hook(barrier)
