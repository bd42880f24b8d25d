"""Each parameter's stored spec under a strategy, and the sharding math the planner checks the
compiler against: per-device block bytes, even splits, the training state's size.

FSDP is `fsdp_xla`'s rule (the ``fsdp`` axis on each parameter's largest dim it divides; with a
``context`` axis, ``fsdp`` x ``context`` together, `mesh.roles.param_shard_axes`); 2-D is
the Hugging Face GPT-2 / Llama plan of `fsdp_xla.hf.plans` (``fsdp`` x ``tensor``, Megatron
style); data parallel replicates. JAX compiles only even splits of a program's arguments, where
torch_xla would pad the last block, so an uneven split is refused before compiling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from mesh import Mesh, Role, roles
from spmd.plan.errors import PlanError
from spmd.plan.request.meshes import STRATEGIES
from spmd.sharding import P, PartitionSpec, resolve_spec

__all__ = [
    "SpecFn",
    "argument_bytes",
    "block_bytes",
    "check_even_splits",
    "param_bytes",
    "param_spec_for",
    "state_bytes",
    "uneven_splits",
]

SpecFn = Callable[[str, tuple[int, ...]], PartitionSpec]
_TWO_D_PLANS = {"gpt2": "gpt2_plan", "llama": "llama_plan", "mistral": "llama_plan", "qwen2": "llama_plan"}


def param_spec_for(strategy: str, mesh: Mesh, hf_config: Any) -> SpecFn:
    """``(name, shape) -> stored spec`` of ``strategy`` (module docstring)."""
    from spmd.sharding import spec_on_largest_dim as default_fsdp_spec

    if strategy == "dp":
        return lambda name, shape: P()
    if strategy in (Role.FSDP.value, "cp"):
        axes = roles.param_shard_axes(mesh.axis_names)  # fsdp, and context: its devices shard parameters too
        size = math.prod(mesh.axis_size(a) for a in axes)
        entry: Any = axes[0] if len(axes) == 1 else axes
        return lambda name, shape: default_fsdp_spec(shape, entry, size)
    if strategy == "2d":
        from fsdp_xla.hf import plans

        model_type = getattr(hf_config, "model_type", None)
        if model_type not in _TWO_D_PLANS:
            raise PlanError(
                f"No 2-D plan for model_type {model_type!r}; known: {sorted(_TWO_D_PLANS)}. Use strategy 'fsdp', or "
                "pass param_spec= a function (name, shape) -> PartitionSpec."
            )
        sharding_plan = getattr(plans, _TWO_D_PLANS[model_type])()
        return lambda name, shape: sharding_plan.spec_for(name, shape, mesh)
    raise PlanError(f"Unknown strategy {strategy!r}; known: {STRATEGIES}.")


def _split_counts(shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh) -> list[int]:
    """How many ways ``spec`` splits each dim of ``shape`` on ``mesh``."""
    return [math.prod(mesh.mesh_shape[a] for a in axes) for axes in resolve_spec(mesh, spec, len(shape), shape)]


def uneven_splits(shapes: Mapping[str, tuple[int, ...]], spec_fn: SpecFn, mesh: Mesh) -> list[str]:
    """Parameters whose spec splits a dim into unequal blocks, as ``name (shape): dim d (n) over k``."""
    out = []
    for name, shape in shapes.items():
        spec = spec_fn(name, shape)
        for dim, (entry, parts) in enumerate(zip(spec.padded(len(shape)), _split_counts(shape, spec, mesh))):
            if shape[dim] % parts:
                axes = (entry,) if isinstance(entry, str) else entry
                out.append(f"{name} {shape}: dim {dim} ({shape[dim]}) over {'x'.join(axes)}={parts}")
    return out


def check_even_splits(strategy: str, shapes: Mapping[str, tuple[int, ...]], spec_fn: SpecFn, mesh: Mesh) -> None:
    """Raise `PlanError` naming the parameters `uneven_splits` finds, and what to change."""
    uneven = uneven_splits(shapes, spec_fn, mesh)
    if uneven:
        listed = "; ".join(uneven[:3]) + (f"; and {len(uneven) - 3} more" if len(uneven) > 3 else "")
        raise PlanError(
            f"The {strategy} plan on mesh {dict(mesh.shape())} splits {len(uneven)} parameter(s) into unequal "
            f"blocks: {listed}. The planner compiles with JAX, which needs each split dim divisible by its axes "
            "(torch_xla would pad the last block). Pad the dim (a vocabulary: Hugging Face's "
            "resize_token_embeddings(n, pad_to_multiple_of=k); GPT-2's 50257 -> 50304), or pick axis sizes that "
            "divide it, or another strategy."
        )


def block_bytes(shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh, itemsize: int) -> int:
    """Bytes of the largest block one device holds (each split dim rounded up)."""
    total = itemsize
    for dim, parts in zip(shape, _split_counts(shape, spec, mesh)):
        total *= -(-dim // parts)
    return total


def param_bytes(shapes: Mapping[str, tuple[int, ...]], spec_fn: SpecFn, mesh: Mesh, weight_bytes: int = 4) -> int:
    """Per-device bytes of the parameters alone (``weight_bytes`` each: 4 fp32, 2 bf16)."""
    return sum(block_bytes(s, spec_fn(n, s), mesh, weight_bytes) for n, s in shapes.items())


def state_bytes(
    shapes: Mapping[str, tuple[int, ...]], spec_fn: SpecFn, mesh: Mesh, moment_bytes: int = 8, weight_bytes: int = 4
) -> int:
    """Per-device bytes of the parameters (``weight_bytes`` each) and AdamW's moments
    (``moment_bytes`` per parameter: 8 for two fp32 moments, 6 with a bf16 first moment), stored alike."""
    return sum(block_bytes(s, spec_fn(n, s), mesh, weight_bytes + moment_bytes) for n, s in shapes.items())


def argument_bytes(
    shapes: Mapping[str, tuple[int, ...]],
    specs: Mapping[str, PartitionSpec],
    mesh: Mesh,
    batch: tuple[int, int],
    axes: tuple[str, ...],
    moment_bytes: int = 8,
    sequence_axes: tuple[str, ...] = (),
    weight_bytes: int = 4,
) -> int:
    """The step's arguments per device by our sharding math: the training state (`state_bytes`)
    and the int32 token batch, its rows split over ``axes``, its sequence over ``sequence_axes``."""
    state = state_bytes(shapes, lambda n, s: specs[n], mesh, moment_bytes, weight_bytes)
    return state + block_bytes(batch, P(axes or None, sequence_axes or None), mesh, 4)
