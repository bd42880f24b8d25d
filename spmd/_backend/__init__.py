"""Runtime backends. Only `torch_xla_backend` exists today; it is the one `_XLAC` user."""

from spmd._backend import torch_xla_backend as backend

__all__ = ["backend"]
