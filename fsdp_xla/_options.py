"""`FSDPOptions`: the options of one `fully_shard` call, checked and resolved, as one value the
engines (`fsdp_xla._engines`) take."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fsdp_xla._sharding import SpecFn
from fsdp_xla.policies import MixedPrecision, WrapPolicy
from mesh import Mesh

__all__ = ["FSDPOptions"]


@dataclass(frozen=True)
class FSDPOptions:
    """The options of `fully_shard` (and `FSDP`), resolved: a `Mesh` with the FSDP axis, one
    `WrapPolicy` or none, a `MixedPrecision` or none.

    Attributes:
        mesh: the device mesh; default the global mesh.
        fsdp_axis: the mesh axis parameters are sharded on.
        auto_wrap_policy: which submodules become units of their own: one
            `TransformerWrapPolicy` or `SizeWrapPolicy` (``None``: the root only, ZeRO-2-like).
        mixed_precision: a `MixedPrecision` (or a dtype, for ``MixedPrecision(dtype)``).
        reshard_after_forward: drop gathered parameters after each unit's forward and
            regather for backward (ZeRO-3). ``False`` keeps them until backward.
        gradient_checkpointing: recompute each non-root unit's activations in backward (on
            the dtensor backend with torch's composable ``checkpoint``).
        optimization_barriers: the barriers that keep XLA from merging the backward regather
            with the forward gather (and from hoisting gathers); turn off only to see why
            they are needed.
        shard_output: layout of the root's outputs (`OutputSharding`). On the dtensor
            backend only ``P(fsdp_axis)``, the layout each rank's part of the batch has.
        param_spec_fn: ``(name, parameter) -> PartitionSpec`` for the stored layout; default:
            the FSDP axis on the largest dim it divides (on the dtensor backend: dim 0, and a
            spec may name only ``fsdp_axis``, on one dim).
        param_init_fn: for deferred init, called on each module of a unit after its
            parameters are allocated on the host; default: the module's
            ``reset_parameters()`` and, for Hugging Face models, ``_init_weights``.
        init_seed: seed of deferred init; each module is seeded from it and its path, so
            the weights are the same for any mesh shape and wrap policy.
        sync_after_backward: run forward+backward as one graph and the optimizer step as
            another (a sync when backward ends). Default (``None``): on the CPU backend only.
            XLA's CPU compiler reduces gradients with an all-reduce and slices each shard out
            inside the optimizer's fused kernels, which run last; in one graph every unit's
            full gradient then stays alive until the optimizer. A TPU compile turns the
            reduction into a reduce-scatter, so the shard is all that stays.
        shardable_layer_norm: make each ``nn.LayerNorm`` a `spmd.ShardableLayerNorm`, which
            GSPMD keeps batch-sharded (torch_xla's own lowering all-gathers the activation
            over the whole mesh; see `spmd.layer_norm`).
    """

    mesh: Mesh
    fsdp_axis: str
    auto_wrap_policy: WrapPolicy | None
    mixed_precision: MixedPrecision | None
    reshard_after_forward: bool
    gradient_checkpointing: bool
    optimization_barriers: bool
    shard_output: Any
    param_spec_fn: SpecFn | None
    param_init_fn: Callable[[torch.nn.Module], None] | None
    init_seed: int
    sync_after_backward: bool | None
    shardable_layer_norm: bool
