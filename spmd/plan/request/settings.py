"""`PlanSettings`: what one plan and every candidate of an advice share, checked once.

`spmd.plan.plan` and `spmd.plan.advise` take the same step settings (the slice, the sequence,
precision, attention, the memory budget); both build one `PlanSettings`, which checks itself in
``__post_init__``, so a bad value is refused the same way, with the same message, before the model
is built or anything compiles. It is a frozen, picklable value: the advisor hands it to its worker
processes and the compile cache keys on it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from spmd.plan.errors import PlanError
from spmd.plan.request.attention import Attention
from spmd.plan.request.fused_projections import fusion_groups, parse_fused
from spmd.plan.request.splash_blocks import PLANNER_BLOCKS, SplashBlocks, parse_splash_blocks
from spmd.plan.request.topology import TpuSlice, parse_slice
from spmd.plan.request.vocab_tiling import check_vocab_tiles

__all__ = ["COMPUTE_DTYPES", "MAX_SCOPED_VMEM_KIB", "MOMENT_DTYPES", "PlanSettings", "WEIGHT_DTYPES"]

COMPUTE_DTYPES = ("bfloat16", "float32")
MOMENT_DTYPES = ("float32", "bfloat16")
WEIGHT_DTYPES = ("float32", "bfloat16")
_ITEMSIZE = {"float32": 4, "bfloat16": 2}  # of each of the state dtypes above


# A core's whole VMEM, the most a kernel could take (v5e's 128 MiB, the largest libtpu has reported here)
MAX_SCOPED_VMEM_KIB = 128 * 1024


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class PlanSettings:
    """The step settings a plan and an advice share.

    Attributes:
        topology: a TPU slice name (`spmd.plan.request.topology.parse_slice`).
        slices: slices joined over DCN.
        seq_len: tokens per sequence; ``None``: the model's default (`spmd.plan.request.models.default_seq_len`).
        compute_dtype: ``bfloat16`` (bf16 compute; master weights as ``weight_dtype``) or ``float32``.
        attention: what ``scaled_dot_product_attention`` runs (`Attention`, or its name).
        hbm_bytes: the per-device budget; ``None``: the device's HBM.
        moment_dtype: AdamW's first moment, ``float32`` or ``bfloat16`` (MaxText's ``mu_dtype``,
            which its Ironwood recipes set to bf16); the second moment is stored as the weights.
        vocab_tiles: chunks of tokens the loss is computed in (MaxText's ``num_vocab_tiling``,
            `spmd.plan.request.vocab_tiling`); 1: the model's own loss, over all the logits at once.
        splash_blocks: the splash kernel's block sizes under ``flash`` (MaxText's ``sa_block_*``:
            `SplashBlocks`, or its text, ``q=1024,kv=1024``); ``None``: the planner's own.
        scoped_vmem_kib: the vector memory (VMEM) one kernel may take, in KiB: libtpu's
            ``xla_tpu_scoped_vmem_limit_kib``, which MaxText's Trillium recipes raise to 98304 for
            splash's larger blocks; ``None``: libtpu's default (32 MiB on v6e).
        weight_dtype: the stored parameters and AdamW's second moment, ``float32`` or
            ``bfloat16`` (MaxText's ``weight_dtype``, which its Llama 3.1-70B recipe on v6e-32
            sets to fit); the gradients come in it too. MaxText's first moment defaults to it:
            give ``moment_dtype="bfloat16"`` as well for MaxText's default.
        fused: sibling projections run as one matmul over their stacked weights (MaxText's
            ``fused_qkv``, ``fused_mlp``): ``qkv``, ``mlp``, both (``"qkv,mlp"``) or none
            (`spmd.plan.request.fused_projections`).
    """

    topology: str
    slices: int = 1
    seq_len: int | None = None
    compute_dtype: str = "bfloat16"
    attention: Attention | str = Attention.DOT
    hbm_bytes: int | None = None
    moment_dtype: str = "float32"
    vocab_tiles: int = 1
    splash_blocks: SplashBlocks | str | None = None
    scoped_vmem_kib: int | None = None
    weight_dtype: str = "float32"
    fused: tuple[str, ...] | str = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention", Attention.parse(self.attention))
        object.__setattr__(self, "fused", parse_fused(self.fused))
        if self.splash_blocks is None:
            object.__setattr__(self, "splash_blocks", PLANNER_BLOCKS)
        if isinstance(self.splash_blocks, str):
            object.__setattr__(self, "splash_blocks", parse_splash_blocks(self.splash_blocks))
        if not isinstance(self.splash_blocks, SplashBlocks):
            raise PlanError(
                f"splash_blocks must be SplashBlocks or its text (q=1024,kv=1024), got {self.splash_blocks!r:.60}."
            )
        if self.splash_blocks.given and self.attention is not Attention.FLASH:
            raise PlanError(
                "splash_blocks sets the splash kernel's blocks, which only --attention flash runs: plan with flash."
            )
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise PlanError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got {self.compute_dtype!r:.60}.")
        if self.moment_dtype not in MOMENT_DTYPES:
            raise PlanError(
                f"moment_dtype must be one of {MOMENT_DTYPES} (AdamW's first moment), got {self.moment_dtype!r:.60}."
            )
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise PlanError(
                f"weight_dtype must be one of {WEIGHT_DTYPES} (the stored parameters: MaxText's weight_dtype), "
                f"got {self.weight_dtype!r:.60}."
            )
        if self.hbm_bytes is not None and not _positive_int(self.hbm_bytes):
            raise PlanError(f"hbm_bytes must be a positive int (bytes per device) or None, got {self.hbm_bytes!r:.60}.")
        if self.seq_len is not None and not _positive_int(self.seq_len):
            raise PlanError(f"seq_len must be a positive int (tokens per sequence) or None, got {self.seq_len!r:.60}.")
        if self.scoped_vmem_kib is not None and not (
            _positive_int(self.scoped_vmem_kib) and self.scoped_vmem_kib <= MAX_SCOPED_VMEM_KIB
        ):
            raise PlanError(
                f"scoped_vmem_kib must be a whole number of KiB from 1 to {MAX_SCOPED_VMEM_KIB} (128 MiB) "
                f"or None, got {self.scoped_vmem_kib!r:.60}. MaxText's recipes give 98304."
            )
        check_vocab_tiles(self.vocab_tiles, self.seq_len)
        if self.splash_blocks.given and self.seq_len is not None:  # the planner's own: check_model_sequence
            self.splash_blocks.resolved(self.seq_len)
        self.target  # noqa: B018 - parses (and so checks) the topology and slices now, not at first use

    def check_model_sequence(self, seq_len: int) -> None:
        """Check against ``seq_len``, the sequence the plan runs, what construction could not: with
        no ``seq_len`` given (the model's default), the vocabulary tiles and the splash blocks; and
        under flash, that the planner's own blocks tile it (called after a plan's context checks,
        whose message for a sequence a context split cannot take is the clearer one).

        Raises:
            PlanError: the tiles or a block do not divide ``seq_len``, or flash's blocks cannot
                (not a multiple of 128).
        """
        if self.seq_len is None:
            check_vocab_tiles(self.vocab_tiles, seq_len)
        if self.attention is Attention.FLASH and (self.seq_len is None or not self.splash_blocks.given):
            self.splash_blocks.resolved(seq_len)  # type: ignore[union-attr]

    def check_model(self, model: Any) -> None:
        """Check against the model what construction could not: that each fusion in ``fused``
        finds projections to stack, of one shape (`fusion_groups`).

        Raises:
            PlanError: a fusion finds nothing to fuse, or projections it cannot stack.
        """
        fusion_groups(model, self.fused)  # type: ignore[arg-type]

    @functools.cached_property
    def target(self) -> TpuSlice:
        """The slice (`TopologyError` for a bad name or slice count)."""
        return parse_slice(self.topology, self.slices)

    @property
    def budget(self) -> int:
        """The per-device memory budget in bytes."""
        return self.target.chip.device_hbm_bytes if self.hbm_bytes is None else self.hbm_bytes

    @property
    def weight_bytes(self) -> int:
        """Bytes of one stored parameter (and of its second moment)."""
        return _ITEMSIZE[self.weight_dtype]

    @property
    def moment_bytes(self) -> int:
        """Bytes per parameter of AdamW's state: the second moment, stored as the parameters, and
        the first moment."""
        return self.weight_bytes + _ITEMSIZE[self.moment_dtype]

    @property
    def compiler_options(self) -> dict[str, Any]:
        """The libtpu options these settings set (none by default)."""
        return {} if self.scoped_vmem_kib is None else {"xla_tpu_scoped_vmem_limit_kib": self.scoped_vmem_kib}

    def cache_key(self) -> dict[str, Any]:
        """What of these settings determines a compile (the compile cache's key)."""
        return {
            "topology": self.topology, "slices": self.slices, "seq_len": self.seq_len,
            "compute_dtype": self.compute_dtype, "attention": self.attention.value,  # type: ignore[union-attr]
            "moment_dtype": self.moment_dtype,
        } | ({"vocab_tiles": self.vocab_tiles} if self.vocab_tiles > 1 else {}) | (
            {"splash_blocks": self.splash_blocks.given} if self.splash_blocks.given else {}  # type: ignore[union-attr]
        ) | (
            {"weight_dtype": self.weight_dtype} if self.weight_dtype != "float32" else {}
        ) | ({"fused": ",".join(self.fused)} if self.fused else {}) | self.compiler_options  # fmt: skip
