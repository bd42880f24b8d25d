"""The two backends and the rule that picks one.

`torch_xla_backend` (GSPMD on lazy XLA tensors) and `dtensor_backend` (``torch.distributed``
DTensor, one process per device) implement `ShardingBackend`. `backend_for(t)` picks:

1. the backend named by `use_backend` (process-wide), if any;
2. else ``torch_xla`` for a tensor on an XLA device;
3. else ``dtensor`` for a DTensor, or for any other tensor once ``torch.distributed`` is
   initialized (launched with torchrun);
4. else ``torch_xla`` where it is installed (its errors then say how to move the tensor to the
   XLA device), and ``dtensor`` where it is not (its errors say how to start
   torch.distributed).

`torch_xla_backend` is also the torch_xla backend's own operations, which only lazy XLA tensors
have (inspector, FSDP on GSPMD); it is the one user of ``torch_xla._XLAC``.
"""

from __future__ import annotations

import importlib.util

import torch

from spmd._backend import torch_xla_backend
from spmd._backend.protocol import ShardingBackend

__all__ = ["torch_xla_backend", "ShardingBackend", "use_backend", "backend_for", "BACKENDS"]

BACKENDS = ("torch_xla", "dtensor")
_chosen: str | None = None  # set by use_backend; the product's one other piece of process state


def _make(name: str) -> ShardingBackend:
    if name == "torch_xla":
        return torch_xla_backend.TorchXlaBackend()
    from spmd._backend.dtensor_backend import DTensorBackend

    return DTensorBackend()


def use_backend(name: str | None) -> None:
    """Use backend ``name`` (``"torch_xla"`` or ``"dtensor"``) for every tensor from now on;
    ``None`` goes back to inferring it from each tensor.

    Raises:
        ValueError: an unknown name (a `spmd.errors.ShardingError`).
    """
    global _chosen
    if name is not None and name not in BACKENDS:
        from spmd.errors import ShardingError

        raise ShardingError(f"Unknown backend {name!r}; use one of {list(BACKENDS)}, or None to infer it.")
    _chosen = name


def backend_for(t: torch.Tensor | None = None) -> ShardingBackend:
    """The backend for tensor ``t`` (see the module docstring for the rule); with no tensor,
    ``dtensor`` once ``torch.distributed`` is initialized, else ``torch_xla``.

    Raises:
        SpmdTypeError: ``t`` is neither a tensor nor None (a list, a numpy array, a module: the
            backend would be a guess, and the fallback's errors would blame the wrong thing).
    """
    if t is not None and not isinstance(t, torch.Tensor):
        from spmd.errors import SpmdTypeError

        raise SpmdTypeError(
            f"backend_for takes a torch.Tensor or None, got {type(t).__name__} {t!r:.60}; pass the tensor itself "
            "(torch.as_tensor(x) for a list or numpy array, a parameter for a module), or nothing for the backend "
            "of this process."
        )
    if _chosen is not None:
        return _make(_chosen)
    if t is None:
        import torch.distributed as dist

        return _make("dtensor" if dist.is_available() and dist.is_initialized() else _fallback())
    if t.device.type == "xla":
        return _make("torch_xla")
    dtensor = _make("dtensor")
    if dtensor.accepts(t):
        return dtensor
    return _make(_fallback())


def _fallback() -> str:
    """The backend whose errors help when no rule applies: torch_xla's where it is installed."""
    return "torch_xla" if importlib.util.find_spec("torch_xla") is not None else "dtensor"
