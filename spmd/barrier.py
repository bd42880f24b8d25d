"""`optimization_barrier`: XLA's barrier that keeps the compiler from merging work across it."""

from __future__ import annotations

import torch

from spmd._backend import backend_for, torch_xla_backend
from spmd.errors import SpmdTypeError

__all__ = ["optimization_barrier", "apply_backward_optimization_barrier"]


def optimization_barrier(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Pass ``tensors`` through one optimization barrier and return the tensors to use.

    XLA may not move computation across the barrier nor common-subexpression-eliminate a value
    computed before it with one computed after it. fsdp_xla uses it so the backward re-gather
    of parameters is not merged with the forward gather. On torch_xla the tensors are updated
    in place (their traced values now come out of the barrier) and returned; on the dtensor
    backend TorchTPU's barrier runs where TorchTPU is loaded, and elsewhere (eager CPU or CUDA,
    where nothing merges work) the tensors come back unchanged.

    Raises:
        SpmdTypeError: an argument is not a tensor, or a tensor the backend of the first one
            cannot take (`NotAnXlaTensorError` on torch_xla: one barrier is one backend's).
    """
    flat = list(tensors)
    for i, t in enumerate(flat):
        if not isinstance(t, torch.Tensor):
            raise SpmdTypeError(f"optimization_barrier: argument {i} is a {type(t).__name__}, not a tensor.")
    if not flat:
        return ()
    backend = backend_for(flat[0])
    for i, t in enumerate(flat):
        if not backend.accepts(t):
            raise backend.refusal(t, f"optimization_barrier: argument {i} (tensor of shape {tuple(t.shape)})")
    return tuple(backend.barrier(flat))


def apply_backward_optimization_barrier(module: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
    """Put an optimization barrier over ``module``'s parameter gradients and input gradients in
    backward (torch_xla's function of this name).

    XLA then cannot fuse this module's backward with its neighbours', which keeps it from
    allocating one large buffer for all of their gradients at once. Returns the hook's handle.

    Raises:
        SpmdTypeError: ``module`` is not an ``nn.Module``.
    """
    if not isinstance(module, torch.nn.Module):
        raise SpmdTypeError(
            f"apply_backward_optimization_barrier needs an nn.Module, got {module!r:.80} ({type(module).__name__})."
        )

    def barrier(mod: torch.nn.Module, grad_input: tuple, grad_output: tuple) -> None:
        grads = [p.grad for p in mod.parameters() if p.grad is not None]
        flat = [g for g in grads + list(grad_input) if isinstance(g, torch.Tensor)]
        if flat:
            torch_xla_backend.optimization_barrier_(flat)

    return module.register_full_backward_hook(barrier)
