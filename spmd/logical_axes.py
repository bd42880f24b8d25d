"""Sharding plans: parameter names -> logical axes -> mesh axes, the way MaxText and Flax do it.

A plan has two ordered tables:

- parameter rules: a regular expression on the parameter's qualified name and the logical
  axis of each of its dims, e.g. ``(r"mlp\\.c_fc\\.weight$", ("embed", "mlp"))``;
- logical-axis rules: each logical axis and the mesh axes it may use, tried in order, e.g.
  ``("embed", "fsdp"), ("mlp", "tensor"), ("vocab", "tensor")``.

For a tensor, each dim's logical axis takes the first of its rules whose mesh axes the mesh
has and the tensor has not used yet (a mesh axis shards one dim at most), else stays
replicated. So one plan serves an FSDP-only mesh ``("fsdp",)``, a 2-D ``("fsdp", "tensor")``
mesh, and a pure data-parallel mesh.

Activations have logical axes too (`ACTIVATION_AXIS_RULES`, MaxText's ``activation_*`` rules of
``logical_axis_rules``): ``activation_batch`` over the batch axes (``data`` x ``fsdp``),
``activation_length`` over ``context``, and ``activation_embed``, ``activation_heads``,
``activation_mlp`` and ``activation_vocab`` over ``tensor``. ``RESIDUAL`` names the residual
stream's dims between blocks, ``(activation_batch, activation_length, activation_embed)``: on a
2-D mesh its width is split over ``tensor`` as MaxText splits it (Megatron's sequence parallelism
splits the sequence there instead), so no tensor shard holds the whole stream.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import torch

from mesh import Mesh, Role, roles
from spmd.errors import ShardingError, SpmdTypeError, UnmatchedParameterError
from spmd.sharding import P, PartitionSpec

__all__ = ["ACTIVATION_AXIS_RULES", "RESIDUAL", "LogicalAxisRules", "ShardingPlan", "UnmatchedParameterError"]

MeshAxes = str | tuple[str, ...]


def _pairs(value: object, what: str, example: str) -> list[tuple[Any, Any]]:
    """``value`` as a list of 2-item pairs whose first item is a str, or SpmdTypeError naming ``what``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise SpmdTypeError(
            f"{what} is a sequence of pairs such as {example}, got {value!r:.80} ({type(value).__name__})."
        )
    for i, pair in enumerate(value):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)):
            raise SpmdTypeError(f"{what}[{i}] is {pair!r:.80}, not a pair such as {example}.")
    return [tuple(pair) for pair in value]


def _names(value: object, allow_none_entries: bool) -> tuple | str | None:
    """A str, None, or a tuple of str (or None entries) from a tuple or list, else ``False`` (not valid)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)) and all(
        isinstance(v, str) or (allow_none_entries and v is None) for v in value
    ):
        return tuple(value)
    return False


@dataclass(frozen=True)
class LogicalAxisRules:
    """Ordered ``(logical axis, mesh axes)`` pairs; a logical axis may appear several times
    (its fallbacks, tried in order)."""

    rules: tuple[tuple[str, MeshAxes | None], ...]

    def __post_init__(self) -> None:
        rules = []
        for i, (logical, axes) in enumerate(_pairs(self.rules, "LogicalAxisRules.rules", "('embed', 'fsdp')")):
            mesh_axes = _names(axes, allow_none_entries=False)
            if mesh_axes is False or mesh_axes == ():
                raise SpmdTypeError(
                    f"LogicalAxisRules.rules[{i}] maps {logical!r} to {axes!r:.80}; give a mesh axis name, a tuple of "
                    "them, or None (replicated)."
                )
            rules.append((logical, mesh_axes))
        object.__setattr__(self, "rules", tuple(rules))

    def mesh_axes_for(self, logical: str | None, mesh: Mesh, used: set[str]) -> MeshAxes | None:
        """The first usable mesh axes for ``logical`` on ``mesh`` given those already ``used``."""
        if logical is None:
            return None
        names = set(mesh.axis_names or ())
        for name, axes in self.rules:
            if name != logical:
                continue
            if axes is None:
                return None
            group = (axes,) if isinstance(axes, str) else tuple(axes)
            if all(a in names for a in group) and not (set(group) & used):
                return axes if isinstance(axes, str) else group
        return None

    def spec(self, logical_axes: Sequence[str | None], mesh: Mesh) -> PartitionSpec:
        """The `PartitionSpec` of a tensor whose dims have ``logical_axes``."""
        used: set[str] = set()
        entries: list[MeshAxes | None] = []
        for logical in logical_axes:
            axes = self.mesh_axes_for(logical, mesh, used)
            if axes is not None:
                used.update((axes,) if isinstance(axes, str) else axes)
            entries.append(axes)
        while entries and entries[-1] is None:
            entries.pop()
        return P(*entries)


@dataclass(frozen=True)
class ShardingPlan:
    """Parameter-name rules and logical-axis rules (module docstring).

    Attributes:
        params: ordered ``(name regex, logical axes per dim)``; the first match wins.
        axes: the logical-axis rules.
        strict: raise `UnmatchedParameterError` for a parameter no rule matches (else it is
            replicated).
        name: a label for messages.
    """

    params: tuple[tuple[str, tuple[str | None, ...]], ...]
    axes: LogicalAxisRules
    strict: bool = True
    name: str = "plan"
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise SpmdTypeError(f"ShardingPlan.name is a str label, got {self.name!r:.80}.")
        if not isinstance(self.axes, LogicalAxisRules):
            raise SpmdTypeError(
                f"{self.name}: axes is a LogicalAxisRules, e.g. LogicalAxisRules((('embed', 'fsdp'),)), got "
                f"{self.axes!r:.80} ({type(self.axes).__name__})."
            )
        if not isinstance(self.strict, bool):
            raise SpmdTypeError(f"{self.name}: strict takes True or False, got {self.strict!r:.80}.")
        params, patterns = [], []
        for i, (pattern, logical) in enumerate(
            _pairs(self.params, f"{self.name}: params", r"(r'mlp\.c_fc\.weight$', ('embed', 'mlp'))")
        ):
            axes = _names(logical, allow_none_entries=True)
            if not isinstance(axes, tuple):
                raise SpmdTypeError(
                    f"{self.name}: params[{i}] gives {logical!r:.80} for {pattern!r:.80}; give a tuple of logical "
                    "axis names (or None), one per dim of the parameter."
                )
            try:
                patterns.append(re.compile(pattern))
            except re.error as e:
                raise ShardingError(
                    f"{self.name}: params[{i}]'s regex {pattern!r:.120} does not compile: {e}."
                ) from None
            params.append((pattern, axes))
        object.__setattr__(self, "params", tuple(params))
        object.__setattr__(self, "_patterns", tuple(patterns))

    def logical_axes(self, name: str, shape: Sequence[int]) -> tuple[str | None, ...] | None:
        """The logical axes of parameter ``name`` (``None`` when no rule matches).

        Raises:
            UnmatchedParameterError: strict plan and no rule matches.
            ShardingError: the rule names more or fewer dims than the parameter has.
        """
        for compiled, (pattern, logical) in zip(self._patterns, self.params):
            if compiled.search(name):
                if len(logical) != len(shape):
                    raise ShardingError(
                        f"{self.name}: rule {pattern!r} gives {len(logical)} logical axes {logical} but parameter "
                        f"{name!r} has shape {tuple(shape)}. Fix the rule's axes."
                    )
                return logical
        if self.strict:
            raise UnmatchedParameterError(
                f"{self.name}: no rule matches parameter {name!r} of shape {tuple(shape)}. Add a rule "
                f"(r'{re.escape(name.rsplit('.', 2)[-2] if '.' in name else name)}', (...)) or use strict=False "
                "to replicate unmatched parameters."
            )
        return None

    def spec_for(self, name: str, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
        """The `PartitionSpec` of parameter ``name`` of ``shape`` on ``mesh``."""
        logical = self.logical_axes(name, shape)
        return P() if logical is None else self.axes.spec(logical, mesh)

    def specs(self, model: torch.nn.Module, mesh: Mesh) -> dict[str, PartitionSpec]:
        """Every parameter's spec, by qualified name (tied parameters once, first name)."""
        return {n: self.spec_for(n, tuple(p.shape), mesh) for n, p in model.named_parameters()}

    def apply(self, model: torch.nn.Module, mesh: Mesh) -> dict[str, PartitionSpec]:
        """``mark_sharding`` every parameter of ``model`` (on the XLA device) as the plan says.

        Returns:
            The specs applied, by parameter name.
        """
        from spmd.mark_sharding import mark_sharding

        specs = self.specs(model, mesh)  # check every parameter before touching any
        for n, p in model.named_parameters():
            mark_sharding(p, mesh, specs[n])
        return specs

    def param_spec_fn(self, mesh: Mesh) -> Any:
        """A ``(name, param) -> PartitionSpec`` function, e.g. for `fsdp_xla.FSDP`'s ``param_spec_fn``."""

        def spec_fn(name: str, param: torch.Tensor) -> PartitionSpec:
            return self.spec_for(name, tuple(param.shape), mesh)

        return spec_fn


def _groups(axes: tuple[str, ...]) -> tuple[MeshAxes, ...]:
    """Every non-empty subset of ``axes`` in their order, the largest first: a rule applies only where
    the mesh has each axis it names, so the fallbacks cover meshes that leave some out."""
    return tuple(g if len(g) > 1 else g[0] for n in range(len(axes), 0, -1) for g in combinations(axes, n))


_ALL = tuple(Role)
ACTIVATION_AXIS_RULES = LogicalAxisRules(
    (
        *(("activation_batch", g) for g in _groups(roles.batch_axes(_ALL))),
        *(("activation_length", g) for g in _groups(roles.sequence_axes(_ALL))),
        *((logical, g) for logical in ("activation_embed", "activation_heads", "activation_mlp", "activation_vocab")
          for g in _groups(roles.tensor_axes(_ALL))),
    )
)  # fmt: skip
RESIDUAL = ("activation_batch", "activation_length", "activation_embed")
