"""``--remat``: what each repeated block keeps for backward, as a JAX checkpoint policy.

Every policy keeps FSDP's rule: a gathered weight is never kept for backward, it is gathered
again (as our optimization barriers make GSPMD do). Naming the gathered value is not enough,
since whatever torch derives from it (a Linear's transposed weight) would be kept instead; so
the policies keep activations only.

- ``none``: keep every activation a block computes, recompute only layout ops (transposes,
  casts, broadcasts, sharding constraints, which is where the gathers are): torch autograd's
  "keep each op's inputs" without activation checkpointing. The most memory, no recomputation.
- ``dots``: keep the outputs of matmuls with no batch dims (the projections and MLP: MaxText's
  ``minimal``, JAX's ``dots_with_no_batch_dims_saveable``) and recompute the rest, attention
  included (its matmuls have batch dims, so no S x S scores are kept). The default.
- ``full``: keep each block's input only and recompute the block in backward (gradient
  checkpointing; ``fsdp_xla``'s ``gradient_checkpointing=True``).
- ``offload``: as ``full``, with each block's input moved to the host's memory (``pinned_host``)
  in forward and back in backward, so the device keeps no per-layer activation at all (MaxText's
  ``decoder_layer_input=offload``; its Llama 3.1 405B recipe on 256 Ironwood chips runs so).

The estimate's recomputation (`recompute_factor`) counts hardware FLOPs, never model FLOPs.
"""

from __future__ import annotations

import enum
from typing import Any

from spmd.plan.errors import PlanError

__all__ = ["BLOCK_INPUT", "Remat", "jax_policy", "recompute_factor"]

BLOCK_INPUT = "xla_spmd_block_input"  # the checkpoint name of a block's input (offloaded by ``offload``)

# Primitives whose outputs `none` recomputes: layout and dtype changes and sharding constraints.
# A gathered weight reaches a matmul only through these, so none of it is kept.
_LAYOUT_PRIMITIVES = frozenset(
    {
        "broadcast_in_dim",
        "convert_element_type",
        "copy",
        "copy_p",
        "expand_dims",
        "reshape",
        "sharding_constraint",
        "squeeze",
        "transpose",
    }
)


class Remat(enum.Enum):
    """What a block keeps for backward (module docstring), least recomputation first."""

    NONE = "none"
    DOTS = "dots"
    FULL = "full"
    OFFLOAD = "offload"

    @classmethod
    def parse(cls, value: str | Remat) -> Remat:
        if isinstance(value, Remat):
            return value
        try:
            return cls(value)
        except ValueError:
            raise PlanError(f"remat must be one of {[r.value for r in cls]}, got {value!r}.") from None

    @property
    def checkpoints_block(self) -> bool:
        """Keeps only the block's input: ``fsdp_xla``'s gradient checkpointing."""
        return self in (Remat.FULL, Remat.OFFLOAD)


def _keep_activations(prim: Any, *_: Any, **__: Any) -> bool:
    return prim.name not in _LAYOUT_PRIMITIVES


def jax_policy(remat: Remat) -> Any:
    """The ``jax.checkpoint`` policy of ``remat``."""
    import jax

    policies = jax.checkpoint_policies
    if remat is Remat.NONE:
        return _keep_activations
    if remat is Remat.DOTS:
        return policies.dots_with_no_batch_dims_saveable
    if remat is Remat.FULL:
        return policies.nothing_saveable
    return policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=[BLOCK_INPUT],
        offload_src="device",
        offload_dst="pinned_host",
    )


def recompute_factor(remat: Remat, attention_share: float) -> float:
    """Hardware FLOPs over model FLOPs: ``dots`` runs attention's forward again
    (``attention_share``: its part of the step's model FLOPs), ``full`` and ``offload`` the
    whole forward (a third of the step)."""
    if remat is Remat.NONE:
        return 1.0
    if remat is Remat.DOTS:
        return 1.0 + attention_share / 3
    return 4 / 3
