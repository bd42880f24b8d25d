"""A sharding constraint on a value and on its gradient, as one op AOTAutograd can record:
`MarkShardingFunction` (torch_xla's name) over the ``spmd::sharding_constraint`` custom op."""

from __future__ import annotations

import ast

import torch

from mesh import Mesh
from spmd._backend.torch_xla_backend.runtime import ensure_spmd
from spmd._backend.torch_xla_backend.shardings import attach_sharding_constraint
from spmd.errors import ShardingError
from spmd.sharding import PartitionSpec, hlo_sharding_for

__all__ = ["MarkShardingFunction"]


@torch.library.custom_op("spmd::sharding_constraint", mutates_args=())
def _sharding_constraint_op(t: torch.Tensor, mesh: str, partition_spec: str) -> torch.Tensor:
    # Mesh and spec travel as text: AOTAutograd (torch.compile, functorch's aot_function) can
    # only record a custom op whose arguments are tensors and plain values.
    spec = PartitionSpec(*ast.literal_eval(partition_spec))
    the_mesh = Mesh.from_str(mesh)
    if the_mesh is None:
        raise ShardingError(f"spmd::sharding_constraint: {mesh[:200]!r} is not the text of a Mesh (str(mesh)).")
    ensure_spmd()
    out = t.clone()
    attach_sharding_constraint(out, hlo_sharding_for(the_mesh, spec, t.dim(), tuple(t.shape)), the_mesh.memo)
    return out


@_sharding_constraint_op.register_fake
def _sharding_constraint_fake(t: torch.Tensor, mesh: str, partition_spec: str) -> torch.Tensor:
    return torch.empty_like(t)


class MarkShardingFunction(torch.autograd.Function):
    """A sharding constraint on a value and, in backward, on its gradient (torch_xla's name).

    ``MarkShardingFunction.apply(x, mesh, spec)`` is `mark_sharding_with_gradients` without the
    argument checks; it records as one custom op, so AOTAutograd keeps both constraints.
    """

    @staticmethod
    def forward(ctx, t: torch.Tensor, mesh: Mesh, partition_spec: object) -> torch.Tensor:  # type: ignore[override]
        ctx.args = (str(mesh), repr(tuple(PartitionSpec.from_value(partition_spec))))
        return _sharding_constraint_op(t, *ctx.args)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return _sharding_constraint_op(grad, *ctx.args), None, None
