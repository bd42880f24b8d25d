"""``torch.nn.functional.linear`` as torch_xla's einsum ops, for activations sharded on more than
one leading dim.

torch_xla lowers ``linear`` on a ``[batch, seq, features]`` input by flattening it to
``[batch * seq, features]``; when ``batch`` and ``seq`` are split over different mesh axes (data
and context parallelism), GSPMD cannot keep both splits in the flattened dim and all-gathers the
activation along the sequence, in forward and again for the weight's gradient. torch_xla's
``XLAPatchedLinear`` (behind its ``EinsumLinear``) computes the same product as one einsum over
the leading dims, forward and backward, so each dim keeps its split.
"""

from __future__ import annotations

import torch

from spmd._backend.torch_xla_backend.runtime import torch_xla_module

__all__ = ["einsum_linear"]


def einsum_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` over every leading dim of ``x`` without flattening them."""
    patched = torch_xla_module("torch_xla.distributed.spmd.xla_sharding", "einsum linear layers").XLAPatchedLinear
    return patched.apply(x, weight, bias)
