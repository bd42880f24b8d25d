"""The planner's exceptions: each a `ShardingError` (a ``ValueError``) whose message gives the fix."""

from __future__ import annotations

from spmd.errors import ShardingError

__all__ = [
    "CompilerVersionError",
    "ModelSpecError",
    "PlanError",
    "StandInReachedError",
    "TopologyError",
    "TracingError",
]


class PlanError(ShardingError):
    """A plan request that cannot be compiled as given (mesh, strategy, batch, attention)."""


class TopologyError(ShardingError):
    """A slice name the planner cannot map to a TPU topology."""


class CompilerVersionError(TopologyError):
    """A TPU generation the installed libtpu does not compile for (``tpu7x`` on libtpu 0.0.20,
    the torch_xla lane's)."""


class ModelSpecError(ShardingError):
    """A model name, config file or factory the planner cannot build."""


class TracingError(PlanError):
    """A model whose ``forward`` the planner cannot run on JAX tracers (an op torchax does not
    lower, Python control flow on a traced value)."""


class StandInReachedError(TracingError):
    """The model reached an ATen name that the installed torch removed and that torchax 0.0.13
    still refers to: the planner's import shim stands in for it only while torchax loads."""
