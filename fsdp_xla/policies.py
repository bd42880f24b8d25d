"""FSDP's options as small values: auto-wrap policies and mixed precision."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from fsdp_xla.errors import FSDPTypeError, WrapPolicyError
from mesh.checks import require_bool, require_int

__all__ = [
    "WrapPolicy",
    "TransformerWrapPolicy",
    "SizeWrapPolicy",
    "transformer_auto_wrap_policy",
    "size_based_auto_wrap_policy",
    "MixedPrecision",
]


class WrapPolicy:
    """Decides which submodules become FSDP units of their own (nested wrapping, ZeRO-3)."""

    def should_wrap(self, module: torch.nn.Module, unwrapped_params: int) -> bool:
        """Whether ``module`` becomes a unit; ``unwrapped_params`` counts its parameters not
        already in a unit below it."""
        raise NotImplementedError

    def check(self, root: torch.nn.Module) -> None:
        """Raise if the policy cannot apply to ``root`` (e.g. names absent classes)."""


@dataclass(frozen=True)
class TransformerWrapPolicy(WrapPolicy):
    """Every instance of the given layer classes is a unit (``GPT2Block``, ``LlamaDecoderLayer``).

    Attributes:
        layer_classes: the classes to wrap.
    """

    layer_classes: frozenset[type[torch.nn.Module]]

    def __post_init__(self) -> None:
        if not self.layer_classes:
            raise WrapPolicyError("TransformerWrapPolicy needs at least one layer class, got none.")
        for cls in self.layer_classes:
            if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
                raise WrapPolicyError(
                    f"TransformerWrapPolicy takes nn.Module subclasses, got {cls!r}. Pass the class itself "
                    "(e.g. GPT2Block), not an instance or a name."
                )

    def should_wrap(self, module: torch.nn.Module, unwrapped_params: int) -> bool:
        return isinstance(module, tuple(self.layer_classes))

    def check(self, root: torch.nn.Module) -> None:
        present = {type(m) for m in root.modules()}
        missing = [c.__name__ for c in self.layer_classes if not any(issubclass(p, c) for p in present)]
        if missing:
            have = sorted({p.__name__ for p in present})
            raise WrapPolicyError(
                f"The wrap policy names layer class(es) {missing} but the model has none; its module classes "
                f"are {have}. Name the model's transformer block class."
            )


@dataclass(frozen=True)
class SizeWrapPolicy(WrapPolicy):
    """Wrap a module once the parameters it holds outside smaller units reach ``min_num_params``.

    Containers (``ModuleList``, ``ModuleDict``) are never wrapped themselves.
    """

    min_num_params: int
    exclude: tuple[type[torch.nn.Module], ...] = field(default=(torch.nn.ModuleList, torch.nn.ModuleDict))

    def __post_init__(self) -> None:
        min_num_params = require_int(self.min_num_params, "min_num_params", WrapPolicyError)
        if min_num_params < 1:
            raise WrapPolicyError(f"min_num_params must be >= 1, got {min_num_params}.")
        object.__setattr__(self, "min_num_params", min_num_params)  # a numpy int is one too
        object.__setattr__(self, "exclude", _module_classes(self.exclude))

    def should_wrap(self, module: torch.nn.Module, unwrapped_params: int) -> bool:
        return unwrapped_params >= self.min_num_params and not isinstance(module, self.exclude)


def _module_classes(exclude: object) -> tuple[type[torch.nn.Module], ...]:
    """``SizeWrapPolicy.exclude`` as a tuple of module classes (one class alone is accepted)."""
    classes = (exclude,) if isinstance(exclude, type) else exclude
    if isinstance(classes, (list, tuple, set, frozenset)) and all(
        isinstance(c, type) and issubclass(c, torch.nn.Module) for c in classes
    ):
        return tuple(classes)
    raise WrapPolicyError(
        f"SizeWrapPolicy(exclude=...) takes a tuple of nn.Module classes that are never wrapped (default "
        f"(nn.ModuleList, nn.ModuleDict)), got {exclude!r:.80}."
    )


def transformer_auto_wrap_policy(layer_classes: Iterable[type[torch.nn.Module]]) -> TransformerWrapPolicy:
    """Wrap each instance of ``layer_classes``: ``transformer_auto_wrap_policy({GPT2Block})``."""
    if isinstance(layer_classes, type):
        layer_classes = [layer_classes]
    if isinstance(layer_classes, str):
        raise WrapPolicyError(
            f"transformer_auto_wrap_policy takes layer classes, got the string {layer_classes!r}: pass the class "
            f"itself ({{{layer_classes}}}), or name it in an fsdp_config.json's transformer_layer_cls_to_wrap."
        )
    if not isinstance(layer_classes, Iterable) or isinstance(layer_classes, (bytes, dict)):
        raise WrapPolicyError(
            f"transformer_auto_wrap_policy takes a set of layer classes, e.g. {{GPT2Block}}; got {layer_classes!r:.80}."
        )
    return TransformerWrapPolicy(frozenset(layer_classes))


def size_based_auto_wrap_policy(min_num_params: int) -> SizeWrapPolicy:
    """Wrap modules holding at least ``min_num_params`` parameters not already wrapped."""
    return SizeWrapPolicy(min_num_params)


_UNSET: Any = object()  # a keyword not given (None is a value param_dtype refuses)


@dataclass(frozen=True, init=False)
class MixedPrecision:
    """Compute in a low precision while the sharded master parameters stay in theirs (fp32).

    The fields are named as FSDP2's ``MixedPrecisionPolicy`` names them; ``compute_dtype`` and
    ``cast_inputs``, their names before round 5, are aliases that still work, as keywords and as
    attributes (``MixedPrecision(compute_dtype=torch.bfloat16).param_dtype is torch.bfloat16``).

    Attributes:
        param_dtype: the dtype parameters are gathered in and the forward/backward run in
            (e.g. ``torch.bfloat16``); the gather itself then moves half the bytes. Alias:
            ``compute_dtype``.
        buffer_dtype: floating-point buffers are cast to this dtype (default: param_dtype).
        reduce_dtype: gradients are reduced across devices in this dtype (default:
            param_dtype; ``torch.float32`` for fp32 reductions).
        cast_forward_inputs: cast floating-point inputs of each unit to ``param_dtype``. Alias:
            ``cast_inputs``.

    Raises:
        FSDPTypeError: a dtype that is not a floating torch.dtype, a flag that is not a bool, or
            a field given under both its names.
    """

    param_dtype: torch.dtype = torch.float32
    buffer_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def __init__(
        self,
        param_dtype: torch.dtype = _UNSET,
        buffer_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        cast_forward_inputs: bool = _UNSET,
        *,
        compute_dtype: torch.dtype = _UNSET,
        cast_inputs: bool = _UNSET,
    ) -> None:
        dtype_name, param_dtype = _one_of("param_dtype", param_dtype, "compute_dtype", compute_dtype, torch.float32)
        cast_name, cast = _one_of("cast_forward_inputs", cast_forward_inputs, "cast_inputs", cast_inputs, True)
        require_bool(cast, f"MixedPrecision.{cast_name}", FSDPTypeError)
        for name, value in ((dtype_name, param_dtype), ("buffer_dtype", buffer_dtype), ("reduce_dtype", reduce_dtype)):
            if value is None and name in ("buffer_dtype", "reduce_dtype"):
                continue
            if not isinstance(value, torch.dtype) or not value.is_floating_point:
                raise FSDPTypeError(
                    f"MixedPrecision.{name} must be a floating torch.dtype (torch.bfloat16, torch.float16, "
                    f"torch.float32), got {value!r}."
                )
        for name, value in (
            ("param_dtype", param_dtype),
            ("buffer_dtype", buffer_dtype),
            ("reduce_dtype", reduce_dtype),
            ("cast_forward_inputs", cast),
        ):
            object.__setattr__(self, name, value)

    @property
    def compute_dtype(self) -> torch.dtype:
        """`param_dtype` under its name before round 5 (an alias)."""
        return self.param_dtype

    @property
    def cast_inputs(self) -> bool:
        """`cast_forward_inputs` under its name before round 5 (an alias)."""
        return self.cast_forward_inputs

    @property
    def effective_buffer_dtype(self) -> torch.dtype:
        """The dtype floating buffers are kept in."""
        return self.buffer_dtype or self.param_dtype

    @property
    def effective_reduce_dtype(self) -> torch.dtype:
        """The dtype gradients are reduced in."""
        return self.reduce_dtype or self.param_dtype


def _one_of(name: str, value: Any, alias: str, alias_value: Any, default: Any) -> tuple[str, Any]:
    """(the keyword used, its value) of a field that has an alias; the default if neither."""
    if value is not _UNSET and alias_value is not _UNSET:
        raise FSDPTypeError(
            f"MixedPrecision got {name}={value!r} and {alias}={alias_value!r}; {alias} is {name}'s old name: "
            f"give {name} only."
        )
    if alias_value is not _UNSET:
        return alias, alias_value
    return name, default if value is _UNSET else value
