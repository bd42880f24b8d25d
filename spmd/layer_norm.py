"""A LayerNorm that GSPMD can keep sharded.

torch_xla 2.9 lowers ``F.layer_norm`` through XLA's ``batch-norm-training`` on a
``[1, batch x seq, d]`` view of the input. GSPMD does not partition that op along the
``batch x seq`` dim: it all-gathers the activation over the whole mesh, forward and backward,
and keeps the gathered copy for backward (measured with `spmd.inspector`: one
``f32[1, 512, 256]`` all-gather per LayerNorm of a batch-sharded GPT block, on every device).
Written as a mean, a variance and elementwise ops over the last dims, the same function
partitions like any elementwise op: each device normalizes its own rows, with no collective.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mesh.checks import is_int, require_bool, require_real
from spmd.errors import SpmdTypeError

__all__ = ["layer_norm", "LayerNormError", "LayerNormShapeError", "ShardableLayerNorm", "use_shardable_layer_norm"]


class LayerNormError(ValueError):
    """A layer norm's setting out of range (a negative or NaN ``eps``, a size below 1)."""


class LayerNormShapeError(LayerNormError):
    """``normalized_shape``, ``weight`` or ``bias`` that does not fit the input's trailing dims
    (``F.layer_norm`` refuses these too, with a RuntimeError)."""


def _normalized_dims(x: object, normalized_shape: object, weight: object, bias: object) -> tuple[int, ...]:
    """The dims to normalize over (negative), after checking every argument against ``x``."""
    if not isinstance(x, torch.Tensor):
        raise SpmdTypeError(f"layer_norm needs a tensor, got {x!r:.80} ({type(x).__name__}).")
    if is_int(normalized_shape):
        normalized_shape = (int(normalized_shape),)  # as nn.LayerNorm(8) takes it
    if not isinstance(normalized_shape, Sequence) or not all(is_int(n) for n in normalized_shape):
        raise SpmdTypeError(f"normalized_shape is an int or a tuple of ints, got {normalized_shape!r:.80}.")
    shape = tuple(int(n) for n in normalized_shape)
    trailing = tuple(x.shape[-len(shape) :]) if shape else ()
    if not shape or len(shape) > x.dim() or trailing != shape:
        raise LayerNormShapeError(
            f"normalized_shape {shape} must be the trailing dims of the input of shape {tuple(x.shape)} (1 to "
            f"{x.dim()} dims, e.g. {tuple(x.shape[-1:])}); got {'no dims' if not shape else trailing}."
        )
    for name, value in (("weight", weight), ("bias", bias)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise SpmdTypeError(f"{name} is a tensor of shape {shape} or None, got {type(value).__name__}.")
        if value is not None and tuple(value.shape) != shape:
            raise LayerNormShapeError(f"{name} must have shape normalized_shape {shape}, got {tuple(value.shape)}.")
    return tuple(range(-len(shape), 0))


def layer_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``F.layer_norm`` in reductions and elementwise ops (same result up to rounding).

    Statistics are computed in float32 for low-precision inputs, as PyTorch does.

    Raises:
        LayerNormShapeError: ``normalized_shape`` is not the input's trailing dims, or ``weight``
            or ``bias`` is not of that shape.
        LayerNormError: ``eps`` is negative or not finite (a NaN made every output NaN).
        SpmdTypeError: ``x`` is not a tensor, ``normalized_shape`` not an int or ints, ``eps``
            not a number.
    """
    dims = _normalized_dims(x, normalized_shape, weight, bias)
    eps = _eps(eps, "layer_norm")
    compute = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    xf = x.to(compute)
    mean = xf.mean(dim=dims, keepdim=True)
    centered = xf - mean
    var = (centered * centered).mean(dim=dims, keepdim=True)
    out = (centered * torch.rsqrt(var + eps)).to(x.dtype)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _eps(eps: object, where: str) -> float:
    return require_real(eps, f"{where}: eps", SpmdTypeError, minimum=0, range_error=LayerNormError)


class ShardableLayerNorm(torch.nn.LayerNorm):
    """``nn.LayerNorm`` whose forward is `layer_norm` (same parameters and state dict).

    Its arguments are ``nn.LayerNorm``'s, checked first: ``normalized_shape`` an int or ints
    each >= 1, ``eps`` a finite number >= 0, ``elementwise_affine`` and ``bias`` bools
    (`SpmdTypeError`, `LayerNormError`; torch took ``'no'`` as true, ``eps=None`` until the
    first forward and a zero size as an empty norm).
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        shape = (normalized_shape,) if is_int(normalized_shape) else normalized_shape
        if isinstance(shape, str) or not isinstance(shape, Sequence) or not shape or not all(is_int(n) for n in shape):
            raise SpmdTypeError(
                f"ShardableLayerNorm: normalized_shape is an int or a non-empty tuple of ints, got {normalized_shape!r:.80}."
            )
        if any(n < 1 for n in shape):
            raise LayerNormError(
                f"ShardableLayerNorm: normalized_shape {tuple(shape)} has a size below 1; sizes are >= 1."
            )
        eps = _eps(eps, "ShardableLayerNorm")
        require_bool(elementwise_affine, "ShardableLayerNorm: elementwise_affine", SpmdTypeError)
        require_bool(bias, "ShardableLayerNorm: bias", SpmdTypeError)
        super().__init__(tuple(int(n) for n in shape), eps, elementwise_affine, bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def use_shardable_layer_norm(module: torch.nn.Module) -> int:
    """Make every ``nn.LayerNorm`` in ``module`` (exactly that class) a `ShardableLayerNorm`,
    in place; returns how many were changed. Subclasses of LayerNorm are left alone: their
    forward may do more.

    Raises:
        SpmdTypeError: ``module`` is not an ``nn.Module``.
    """
    if not isinstance(module, torch.nn.Module):
        raise SpmdTypeError(
            f"use_shardable_layer_norm needs an nn.Module, got {module!r:.80} ({type(module).__name__})."
        )
    changed = 0
    for sub in module.modules():
        if type(sub) is torch.nn.LayerNorm:
            sub.__class__ = ShardableLayerNorm
            changed += 1
    return changed
