"""The dtensor backend's collective for context parallelism: one dim of a tensor all-gathered over
a process group, its gradient reduce-scattered back (`spmd.context`).

Each process of the group holds one part of the sequence; attention needs every part's keys
and values. Forward concatenates the parts in group-rank order (the order the mesh lays the
context axis out, `dtensor_meshes`); backward sums every process's gradient of the whole and
hands each its own part, which is the all-gather's adjoint.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["all_gather_dim", "axis_coordinate"]


def _dist() -> Any:
    import torch.distributed as dist

    return dist


class _AllGatherDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, group: Any, dim: int) -> torch.Tensor:  # noqa: ANN001
        ctx.group, ctx.dim = group, dim
        parts = _dist().get_world_size(group)
        local = t.movedim(dim, 0).contiguous()
        whole = local.new_empty((parts * local.shape[0], *local.shape[1:]))
        _dist().all_gather_into_tensor(whole, local, group=group)
        return whole.movedim(0, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001
        parts = _dist().get_world_size(ctx.group)
        whole = grad.movedim(ctx.dim, 0).contiguous()
        mine = whole.new_empty((whole.shape[0] // parts, *whole.shape[1:]))
        _dist().reduce_scatter_tensor(mine, whole, group=ctx.group)
        return mine.movedim(0, ctx.dim), None, None


def all_gather_dim(t: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
    """Every process's ``t`` of ``group`` concatenated along ``dim`` in group-rank order; its
    gradient goes back reduce-scattered (summed over the group, each process its own part)."""
    return _AllGatherDim.apply(t, group, dim)


def axis_coordinate(device_mesh: Any, axis: str) -> int:
    """This process's coordinate along mesh axis ``axis`` of ``device_mesh``."""
    return int(device_mesh.get_local_rank(axis))
