"""torch_xla's ``torch_xla.distributed.spmd.debugging``: the sharding tables of its docs.

``visualize_sharding(text)`` is torch_xla's own (it draws an HLO sharding text, which is ours
too); ``visualize_tensor_sharding(t)`` draws the sharding `spmd.get_sharding` reads, so both
print what torch_xla's do. `spmd.visualize_sharding` is our richer table (ranges per block,
any shape, no device needed).
"""

from __future__ import annotations

from typing import Any

import torch

from spmd.errors import SpmdTypeError
from spmd.mark_sharding import get_sharding
from spmd.sharding import HloSharding

__all__ = ["visualize_sharding", "visualize_tensor_sharding"]


def visualize_sharding(sharding: str, **kwargs: Any) -> Any:
    """torch_xla's table of an HLO sharding text (``'{devices=[2,2]0,1,2,3}'``); imports torch_xla.

    Raises:
        HloShardingError: ``sharding`` is not an HLO sharding text (parsed here first: torch_xla's
            table fails on one with a bare ValueError).
        TorchXlaNotInstalledError: torch_xla is not installed (`spmd.visualize_sharding` draws
            the same blocks without it).
    """
    from spmd._backend import torch_xla_backend

    text = str(HloSharding.parse(sharding))  # iota forms expanded: torch_xla's table reads listed ids
    feature = "spmd.debugging.visualize_sharding (torch_xla's own table; spmd.visualize_sharding needs no torch_xla)"
    return torch_xla_backend.torch_xla_module("torch_xla.distributed.spmd.debugging", feature).visualize_sharding(
        text, **kwargs
    )


def visualize_tensor_sharding(t: torch.Tensor, **kwargs: Any) -> Any:
    """torch_xla's table of ``t``'s sharding (an XLA tensor, or what `mark_sharding` returned).

    Raises:
        SpmdTypeError: ``t`` carries no sharding to draw.
    """
    sharding = get_sharding(t)
    if sharding is None:
        raise SpmdTypeError(
            f"visualize_tensor_sharding: the tensor of shape {tuple(t.shape)} carries no sharding; mark it first "
            "(mark_sharding(t, mesh, spec))."
        )
    return visualize_sharding(str(sharding), **kwargs)
