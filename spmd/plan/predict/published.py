"""Published training runs the planner's predictions go beside, and the shapes to plan them with.

Each `Published` run is a figure a source measured (MFU against the chip's bf16 peak, and the
TFLOP/s per chip it gives, both as the source's MaxText counted FLOPs) and, where its recipe is
public, a `Recipe`: the plan that runs the same model shape on the same slice (batch, mesh, remat
policy, attention). ``benchmarks/plan_prediction.py`` plans each recipe and compares
the predicted TFLOP/s per chip with the published one; `spmd.plan.predict._calibration` names the runs
the step-time model was fitted on (the others are held out).

**Two FLOP counts.** The planner counts causal attention once (half the square), as MaxText did
when it wrote its v5e and v5p READMEs (2023-12: ``train.py``'s "due to causality in attention")
and does again since mid-2025 (tpu-recipes-v0.1.5). From 2024-05 (tpu-recipes-v0.1.4, 2025-07-10,
still) it counted the whole square, Megatron's count ("megatron tflops calculation does not
account for causality in attention"), so a figure published then, tpu-recipes' Trillium runs, is
higher than the same step as the planner counts it: 12.5 % for Llama 3.1-8B at 8,192 tokens.
Such a run is marked `Published.counts_attention_whole`, and `Published.planner_tflops` gives its
figure in the planner's count: the same step time. Where a source gives the step time or tokens a
second beside its TFLOP/s, they decide the count (tests/spmd/plan/test_calibration.py); otherwise
MaxText's version at the time does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from mesh import Role
from spmd.mfu.flops import TransformerShape, matmul_flops_per_token
from spmd.plan.predict._calibration import SliceScaling
from spmd.plan.request.dcn import DCN_PREFIX, whole_sizes
from spmd.plan.request.meshes import batch_axes
from spmd.plan.request.models import builtin_config
from spmd.plan.request.splash_blocks import PLANNER_BLOCKS, SplashBlocks, parse_splash_blocks
from spmd.plan.request.topology import CHIP_SPECS

__all__ = ["PUBLISHED", "Published", "Recipe", "published_for", "published_run", "run_name", "slice_scaling"]


FSDP, CONTEXT, TENSOR = Role.FSDP.value, Role.CONTEXT.value, Role.TENSOR.value


@dataclass(frozen=True)
class Recipe:
    """How to plan a published run: ``spmd.plan.plan(model, topology, strategy=..., mesh=...,
    global_batch=..., seq_len=..., remat=..., attention=..., moment_dtype=...)``.

    Attributes:
        topology: the slice (`spmd.plan.request.topology.parse_slice`).
        strategy: ``fsdp``, ``2d`` or ``cp`` (fsdp x context: the sequence split over ``context``).
        mesh: axis sizes, in order (``(("fsdp", 16), ("tensor", 4))``).
        per_device_batch: MaxText's ``per_device_batch_size``: sequences per JAX device (a
            TensorCore on TPU7x), a fraction where the sequence is split (``0.125``: 8 devices a
            sequence over ``context``).
        seq_len: tokens per sequence (``max_target_length``).
        remat: the planner's remat policy nearest the recipe's: a preset (`spmd.plan.request.remat.Remat`) or
            MaxText's per-tensor choices as ``custom:name=choice,...`` (`spmd.plan.request.custom_remat`).
        attention: ``flash`` (MaxText's ``attention='flash'``, splash on TPU) or ``dot``.
        moment_dtype: AdamW's first moment (MaxText's ``mu_dtype``).
        vocab_tiles: the loss in this many chunks of tokens (MaxText's ``num_vocab_tiling``,
            `spmd.plan.request.vocab_tiling`); 1: untiled.
        slices: slices joined over DCN (MaxText's ``num_slices``); the mesh names the axes that
            span them as ``dcn_<axis>`` sizes (`spmd.plan.request.dcn`: ``(("dcn_fsdp", 2), ("fsdp", 256))``).
        splash_blocks: the splash kernel's block sizes the recipe sets (MaxText's ``sa_block_*``,
            `spmd.plan.request.splash_blocks`, its fused backward too); none: the planner's own.
            Each kernel's pairs of blocks are costed by its sizes, causal and windowed alike.
        scoped_vmem_kib: libtpu's ``xla_tpu_scoped_vmem_limit_kib`` where the plan needs the
            recipe's (MaxText's ``DENSE_VMEM_LIMIT_FLAG``, 98304); ``None``: libtpu's default.
        weight_dtype: the stored parameters and second moment (MaxText's ``weight_dtype``).
        fused: the sibling projections the recipe runs as one matmul (MaxText's ``fused_qkv``,
            ``fused_mlp``: ``("qkv", "mlp")``, `spmd.plan.request.fused_projections`).
    """

    topology: str
    strategy: str
    mesh: tuple[tuple[str, int], ...]
    per_device_batch: float
    seq_len: int
    remat: str
    attention: str = "flash"
    moment_dtype: str = "float32"
    vocab_tiles: int = 1
    slices: int = 1
    splash_blocks: SplashBlocks = PLANNER_BLOCKS
    scoped_vmem_kib: int | None = None
    weight_dtype: str = "float32"
    fused: tuple[str, ...] = ()

    @property
    def global_batch(self) -> int:
        """Sequences per step: MaxText's per-device batch times every device of the mesh (every
        slice's: a ``dcn_`` size multiplies its axis)."""
        return round(self.per_device_batch * math.prod(whole_sizes(dict(self.mesh)).values()))

    @property
    def batch_per_shard(self) -> int:
        """Sequences per batch shard (the mesh's axes but ``tensor``): the recipe's global batch
        over its batch shards."""
        shape = whole_sizes(dict(self.mesh))
        return self.global_batch // math.prod(shape[a] for a in batch_axes(shape))


@dataclass(frozen=True)
class Published:
    """One published run: model, TPU chips, MFU, how it ran, where it is published, the TFLOP/s
    per chip the source gives (``None``: MFU only), the recipe to plan it with (``None``: not
    public), whether the source counted causal attention whole (module docstring), and a variant
    that tells two recipes of one model on one slice shape apart in `run_name` (``""``: none)."""

    model: str
    chip: str
    chips: int
    mfu: float
    setup: str
    source: str
    tflops_per_chip: float | None = None
    recipe: Recipe | None = None
    counts_attention_whole: bool = False
    variant: str = ""

    def __post_init__(self) -> None:
        if self.counts_attention_whole and self.recipe is None:
            raise ValueError(
                f"{self.model} on {self.chips} chips: a whole attention count needs the recipe's sequence."
            )

    @property
    def peak_flops(self) -> float:
        """The chip's bf16 peak FLOP/s, which the run's MFU is over."""
        return next(c.peak_flops for c in CHIP_SPECS.values() if c.name == self.chip)

    def planner_tflops(self) -> float:
        """TFLOP/s per chip in the planner's count (causal attention halved): the source's figure,
        or its MFU times the chip's peak, scaled down for a source that counted attention whole."""
        published = self.tflops_per_chip or self.mfu * self.peak_flops / 1e12
        if not self.counts_attention_whole:
            return published
        assert self.recipe is not None  # __post_init__
        return published * _halved_over_whole(self.model, self.recipe.seq_len)

    def line(self) -> str:
        mfu = f"{self.mfu:.1%} MFU"
        if self.counts_attention_whole:
            planner_mfu = self.planner_tflops() * 1e12 / self.peak_flops
            mfu += f" counting causal attention whole, {planner_mfu:.1%} as the planner counts"
        return f"{self.source}: {self.model} on {self.chips} {self.chip} chips, {mfu} ({self.setup})"


@functools.cache
def _halved_over_whole(model: str, seq_len: int) -> float:
    """A step's FLOPs with causal attention halved over the same counted whole."""
    shape = TransformerShape.from_hf_config(builtin_config(model))
    return matmul_flops_per_token(shape, seq_len) / matmul_flops_per_token(shape, seq_len, causal=False)


def _maxtext_readme(slices: int, topology: str) -> str:
    """The row of MaxText's ``configs/<generation>/README.md`` for ``slices`` x ``topology``."""
    return f"maxtext MaxText/configs/{topology.split('-')[0]}/README.md, {slices}x {topology}"


_MAXTEXT_V5E = _maxtext_readme(1, "v5e-256")
_MAXTEXT_V5P = _maxtext_readme(1, "v5p-128")
# MaxText's configs/v5e/*.sh and configs/v5p/*.sh: global_parameter_scale models at 2048 tokens, flash
# attention, pure FSDP on v5e (ici_fsdp_parallelism=-1), FSDP x tensor 4 on v5p; fp32 AdamW moments.
# Each recipe is the script as it stands (per_device_batch_size 32B 6, 64B 3, 128B and 256B 1 on
# v5p). The READMEs' figures are older than the scripts' batches: written 2023-12-15 beside
# scripts that ran 8, 4, 2 and 2, which became 7, 4, 2, 1 in February 2024 and then today's.
_V5E = "MaxText, FSDP over 256 chips, per-device batch {} x 2048 tokens, remat full, flash attention"
_V5P = "MaxText, FSDP 16 x tensor 4, per-device batch {} x 2048 tokens, remat minimal, flash attention"


def _v5e(batch: int) -> Recipe:
    return Recipe("v5e-256", FSDP, ((FSDP, 256),), batch, 2048, "full")


def _v5p(batch: int) -> Recipe:
    return Recipe("v5p-128", "2d", ((FSDP, 16), (TENSOR, 4)), batch, 2048, "dots")


# MaxText's configs/v5p/128b.sh and 256b.sh: per_device_batch_size=1, ici_tensor_parallelism=8, FSDP
# over the rest of the slice, remat minimal.
def _v5p_tensor_8(topology: str, fsdp: int) -> Recipe:
    return Recipe(topology, "2d", ((FSDP, fsdp), (TENSOR, 8)), 1, 2048, "dots")


_V5P_T8 = "MaxText, FSDP {} x tensor 8, per-device batch 1 x 2048 tokens, remat minimal, flash attention"


# MaxText's remat_policy=custom of the tpu-recipes Trillium runs (`spmd.plan.request.custom_remat`): the layer
# input and the named projections offloaded to host.
_V6E_8B_REMAT = (
    "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,value_proj=offload,out_proj=offload"
)
_V6E_70B_REMAT = "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,value_proj=offload"
# MaxText's qkv_proj_offloaded (maxtext_utils.get_save_and_offload_names): q, k and v offloaded to
# host (named after the fused projection is split), nothing else saved.
_QKV_PROJ_OFFLOADED = "custom:query_proj=offload,key_proj=offload,value_proj=offload"
# The v6e runs' loss: MaxText's recipes do not tile the vocabulary; the planner's untiled loss holds
# several fp32 copies of the [tokens, vocab] logits (one is 5 x 8192 x 128256 x 4 bytes, 19.6 GiB,
# at the 70B's batch), so it tiles them for the recipe's batch to fit, at the price of one more pass
# of the head's matmul (docs/plan.md, "Calibration").
_V6E_VOCAB_TILES = 8
# tpu-recipes' Llama 3.1 Trillium configs (maxtext_trillium_model_configs.py at 9f1820b, MaxText
# tpu-recipes-v0.1.4): the 8B's and 70B's sa_block_* all 2048 with sa_use_fused_bwd_kernel, the
# 405B's sa_block_q 1024, sa_block_q_dkv and sa_block_q_dq 2048 (the others MaxText's 512); each
# with DENSE_VMEM_LIMIT_FLAG, --xla_tpu_scoped_vmem_limit_kib=98304. The three recipes carry them;
# tpu-recipes' Mistral 7B sets the 8B's blocks, its Llama 2-70B and GPT-3 175B the 405B's
_V6E_BLOCKS_2048_FUSED = parse_splash_blocks("2048,use_fused_bwd_kernel=true")
_V6E_BLOCKS_QUERY_1024 = parse_splash_blocks("q=1024,q_dkv=2048,q_dq=2048")
_V6E_SCOPED_VMEM_KIB = 98304
# tpu-recipes' Gemma3-12B configs (maxtext_trillium_model_configs.py at tpu-recipes-v0.1.5): sa_block_*
_GEMMA3_SPLASH_BLOCKS = parse_splash_blocks(
    "q=1024,kv=1024,kv_compute=1024,q_dkv=512,kv_dkv=2048,kv_dkv_compute=512,q_dq=1024,kv_dq=1024"
)


def _v6e_8b(chips: int, batch: int, tflops: float, config: str) -> Published:
    """tpu-recipes' Llama 3.1-8B on one v6e slice of ``chips`` chips: pure FSDP, ``batch``
    sequences of 8192 a chip, the layer input and q/k/v/out offloaded (``config``: its MaxText
    model config); the README's step log gives TFLOP/s a device only (MFU: over v6e's peak)."""
    return Published(
        "llama3.1-8b", "TPU v6e", chips, round(tflops * 1e12 / CHIP_SPECS["v6e"].peak_flops, 4),
        f"MaxText, FSDP over {chips} chips, per-device batch {batch} x 8192 tokens, splash attention in blocks of "
        "2048 with the fused backward kernel, remat custom (the layer input and q/k/v/out projections offloaded "
        "to host)",
        f"tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-{chips} ({config})", tflops,
        Recipe(
            f"v6e-{chips}", FSDP, ((FSDP, chips),), batch, 8192, _V6E_8B_REMAT, vocab_tiles=_V6E_VOCAB_TILES,
            splash_blocks=_V6E_BLOCKS_2048_FUSED, scoped_vmem_kib=_V6E_SCOPED_VMEM_KIB,
        ),
        counts_attention_whole=True,
    )  # fmt: skip


def _v6e_70b(chips: int, batch: int, tflops: float, config: str, weight_dtype: str = "float32") -> Published:
    """tpu-recipes' Llama 3.1-70B on one v6e slice of ``chips`` chips: pure FSDP, ``batch``
    sequences of 8192 a chip, the layer input and q/k/v offloaded, splash in blocks of 2048 with
    the fused backward (``config``: its MaxText model config; ``weight_dtype``: its parameters',
    which MaxText's mu_dtype follows); the README's step log gives TFLOP/s a device only."""
    weights = " and bf16 weights" if weight_dtype == "bfloat16" else ""
    return Published(
        "llama3.1-70b", "TPU v6e", chips, round(tflops * 1e12 / CHIP_SPECS["v6e"].peak_flops, 4),
        f"MaxText, FSDP over {chips} chips, per-device batch {batch} x 8192 tokens, splash attention in blocks of "
        f"2048 with the fused backward kernel, remat custom (the layer input and q/k/v projections offloaded to "
        f"host){weights}",
        f"tpu-recipes training/trillium/Llama3.1-70B-MaxText/v6e-{chips} ({config})", tflops,
        Recipe(
            f"v6e-{chips}", FSDP, ((FSDP, chips),), batch, 8192, _V6E_70B_REMAT, vocab_tiles=_V6E_VOCAB_TILES,
            splash_blocks=_V6E_BLOCKS_2048_FUSED, scoped_vmem_kib=_V6E_SCOPED_VMEM_KIB,
            weight_dtype=weight_dtype, moment_dtype=weight_dtype,
        ),
        counts_attention_whole=True,
    )  # fmt: skip


_ONE_SLICE: tuple[Published, ...] = (
    Published(
        "llama3.1-70b", "TPU7x", 64, 0.523,
        "MaxText, FSDP over 128 devices, per-device batch 2 x 8192 tokens, splash attention, remat saving the "
        "layer input, context and q/k/v projections on device, bf16 first moment",
        "tpu-recipes training/ironwood/llama3.1-70b/8k-bf16-tpu7x-4x4x4", 1207.0,
        # remat_policy=custom keeping decoder_layer_input, context and query/key/value_proj on device:
        # save_qkv_context (planned with `full` before that policy existed)
        Recipe("tpu7x-128", FSDP, ((FSDP, 128),), 2, 8192, "save_qkv_context", moment_dtype="bfloat16"),
    ),
    Published(
        "llama3.1-405b", "TPU7x", 256, 0.547,
        "MaxText, pure FSDP over 512 devices, per-device batch 3 x 8192 tokens, splash attention, the layer "
        "input and MLP output offloaded to host, k/v projections kept on device, bf16 first moment",
        "tpu-recipes training/ironwood/llama3.1-405b/8k-bf16-tpu7x-4x8x8", 1261.0,
        # tpu-recipes' run_recipe.sh: remat_policy=custom with decoder_layer_input=offload, mlpwo=offload
        # (never read by backward: nothing of it is kept), key_proj=device, value_proj=device;
        # num_vocab_tiling=4, mu_dtype=bfloat16 (planned with `offload` and no tiling until issue 37)
        Recipe(
            "tpu7x-512", FSDP, ((FSDP, 512),), 3, 8192,
            "custom:decoder_layer_input=offload,key_proj=device,value_proj=device,mlpwo=offload",
            moment_dtype="bfloat16", vocab_tiles=4,
        ),
    ),
    Published(
        "llama3.1-70b", "TPU7x", 256, 0.389,
        "MaxText, context parallelism 8 (all_gather, load-balanced) x FSDP 64 over 512 devices, per-device batch "
        "0.125 x 131072 tokens (64 sequences), splash attention, remat keeping the layer input, context and q/k/v "
        "projections on device, vocabulary tiled 4 ways, fp32 Adam moments; 34.02 s a step",
        "tpu-recipes training/ironwood/llama3.1-70b/128k-bf16-tpu7x-4x8x8", 897.94,
        # its remat_policy=custom keeps decoder_layer_input, context, query/key/value_proj (and the never
        # read mlpwo) on device: save_qkv_context; opt_type=adam_pax with mu_dtype unset, so fp32 moments
        Recipe("tpu7x-512", "cp", ((FSDP, 64), (CONTEXT, 8)), 0.125, 131072, "save_qkv_context", vocab_tiles=4),
    ),
    # MaxText's v5e and v5p READMEs (2023-12) halve causal attention, as the Ironwood and Gemma 3
    # runs do; tpu-recipes' Trillium runs (MaxText of 2024-05 to 2025-07) count it whole
    Published("maxtext-16b", "TPU v5e", 256, 0.6110, _V5E.format(6), _MAXTEXT_V5E, 120.0, _v5e(6)),
    Published("maxtext-32b", "TPU v5e", 256, 0.6686, _V5E.format(4), _MAXTEXT_V5E, 132.0, _v5e(4)),
    Published("maxtext-64b", "TPU v5e", 256, 0.5990, _V5E.format(2), _MAXTEXT_V5E, 118.0, _v5e(2)),
    Published(
        "maxtext-128b", "TPU v5e", 256, 0.5606,
        "MaxText, FSDP 16 x tensor 16, per-device batch 1 x 2048 tokens, remat qkv_proj_offloaded (q, k "
        "and v offloaded to host), fused q/k/v and MLP, flash attention", _MAXTEXT_V5E, 110.0,
        # MaxText's configs/v5e/128b.sh as it stands (remat_policy was full beside the README's figure
        # in 2023-12, minimal_offloaded from 2024-02), with its fused q/k/v and MLP projections
        Recipe("v5e-256", "2d", ((FSDP, 16), (TENSOR, 16)), 1, 2048, _QKV_PROJ_OFFLOADED, fused=("qkv", "mlp")),
    ),
    Published("maxtext-32b", "TPU v5p", 64, 0.7147, _V5P.format(6), _MAXTEXT_V5P, 328.0, _v5p(6)),
    Published("maxtext-64b", "TPU v5p", 64, 0.7031, _V5P.format(3), _MAXTEXT_V5P, 323.0, _v5p(3)),
    Published(
        "maxtext-128b", "TPU v5p", 128, 0.6868, _V5P_T8.format(16), _maxtext_readme(1, "v5p-256"),
        315.0, _v5p_tensor_8("v5p-256", 16),
    ),
    Published(
        "maxtext-128b", "TPU v5p", 256, 0.6883, _V5P_T8.format(32), _maxtext_readme(1, "v5p-512"),
        316.0, _v5p_tensor_8("v5p-512", 32),
    ),
    Published(
        "maxtext-256b", "TPU v5p", 512, 0.6709, _V5P_T8.format(64), _maxtext_readme(1, "v5p-1024"),
        308.0, _v5p_tensor_8("v5p-1024", 64),
    ),
    Published(
        "llama3.1-8b", "TPU v6e", 256, 0.455,
        "MaxText, FSDP over 256 chips, per-device batch 4 x 8192 tokens, splash attention in blocks of 2048 with the "
        "fused backward kernel, remat custom (the layer input and q/k/v/out projections offloaded to host)",
        "tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-256 (maxtext docs/reference/models/tiering.md)", 417.4,
        Recipe(
            "v6e-256", FSDP, ((FSDP, 256),), 4, 8192, _V6E_8B_REMAT, vocab_tiles=_V6E_VOCAB_TILES,
            splash_blocks=_V6E_BLOCKS_2048_FUSED, scoped_vmem_kib=_V6E_SCOPED_VMEM_KIB,
        ),
        True,
    ),
    # the same recipe on smaller v6e slices (tpu-recipes' READMEs' step logs; the batch is each
    # slice's MaxText model config's, benchmarks/maxtext_trillium_model_configs.py at 9f1820b)
    _v6e_8b(8, 3, 413.433, "llama3_1_8b_8192_no_collective_matmul"),
    _v6e_8b(16, 3, 419.485, "llama3_1_8b_8192_no_collective_matmul"),
    _v6e_8b(32, 3, 407.225, "llama3_1_8b_8192_no_collective_matmul"),
    _v6e_8b(64, 5, 419.701, "llama3_1_8b_8192_bs5"),
    _v6e_8b(128, 4, 412.319, "llama3_1_8b_8192"),
    Published(
        "llama3.1-70b", "TPU v6e", 256, 0.503,
        "MaxText, FSDP over 256 chips, per-device batch 5 x 8192 tokens, splash attention, remat custom (the layer "
        "input and q/k/v projections offloaded to host)",
        "tpu-recipes training/trillium/Llama3.1-70B-MaxText/v6e-256 (maxtext docs/reference/models/tiering.md)", 462.3,
        Recipe(
            "v6e-256", FSDP, ((FSDP, 256),), 5, 8192, _V6E_70B_REMAT, vocab_tiles=_V6E_VOCAB_TILES,
            splash_blocks=_V6E_BLOCKS_2048_FUSED, scoped_vmem_kib=_V6E_SCOPED_VMEM_KIB,
        ), True,
    ),
    # the same recipe on smaller v6e slices (their READMEs' step logs, configs at 9f1820b); on
    # v6e-32 MaxText stores the weights, and so both moments, in bf16 to fit
    _v6e_70b(32, 2, 443.385, "llama3_1_70b_8192_bs2_bfloat16_no_collective_matmul", weight_dtype="bfloat16"),
    _v6e_70b(64, 2, 422.091, "llama3_1_70b_8192_bs2"),
    _v6e_70b(128, 4, 453.500, "llama3_1_70b_8192_bs4"),
    Published(
        "llama3.1-405b", "TPU v6e", 512, 0.428,
        "MaxText on 2 x v6e-256, FSDP over 256 chips a slice and across the 2 slices (dcn_fsdp_parallelism 2), "
        "per-device batch 1 x 8192 tokens, splash attention (query blocks of 1024, 2048 in backward), remat custom "
        "(the layer input offloaded to host)",
        "tpu-recipes training/trillium/Llama3.1-405B-MaxText (llama3_1_405b_8192_pure_fsdp_ici, 2 slices)", 392.454,
        Recipe(
            "v6e-256", FSDP, ((DCN_PREFIX + FSDP, 2), (FSDP, 256)), 1, 8192, "offload",
            vocab_tiles=_V6E_VOCAB_TILES, slices=2, splash_blocks=_V6E_BLOCKS_QUERY_1024,
            scoped_vmem_kib=_V6E_SCOPED_VMEM_KIB,
        ),
        counts_attention_whole=True,
    ),
    Published(
        "llama3.1-405b", "TPU v6e", 512, 0.3984,
        "MaxText on 2 x v6e-256, FSDP over 64 chips x tensor parallelism over 4 a slice and FSDP across the 2 "
        "slices (dcn_fsdp_parallelism 2, custom_mesh hybrid_ring_64x4), per-device batch 1 x 8192 tokens, splash "
        "attention (query blocks of 1024, 2048 in backward), remat custom (the layer input and q/k/v/out "
        "projections offloaded to host)",
        "tpu-recipes training/trillium/Llama3-405B-MaxText (llama3_1_405b_8192_fsdp_dcn, 2 slices, "
        "libtpu-nightly 20241028)", 365.740,
        # its step log: 58.805 s, 139.307 tokens/s a device, total_weights 4,194,304 (512 x 8192)
        Recipe(
            "v6e-256", "2d", ((DCN_PREFIX + FSDP, 2), (FSDP, 64), (TENSOR, 4)), 1, 8192, _V6E_8B_REMAT, slices=2,
            splash_blocks=_V6E_BLOCKS_QUERY_1024, scoped_vmem_kib=_V6E_SCOPED_VMEM_KIB,
        ),
        counts_attention_whole=True,
        variant="fsdp64xtensor4",
    ),
    *(
        Published(
            "gemma3-12b", "TPU v6e", 256 * slices, round(tflops * 1e12 / CHIP_SPECS["v6e"].peak_flops, 4),
            f"MaxText on {f'{slices} x ' if slices > 1 else ''}v6e-256, FSDP over 256 chips a slice"
            + (" (ici_fsdp_transpose_parallelism) and DCN data parallelism" if slices > 1 else "")
            + ", per-device batch 1 x 32768 tokens, splash attention (five sliding-window layers of 1024 tokens to "
            "one global; MaxText's splash blocks), remat custom (only the layer input kept), vocabulary tiled 16 ways",
            f"tpu-recipes training/trillium/Gemma3-12B-MaxText/{folder} ({config})", tflops,
            Recipe(
                "v6e-256", FSDP, ((DCN_PREFIX + Role.DATA.value, slices), (FSDP, 256)) if slices > 1 else ((FSDP, 256),),
                1, 32768, "custom:decoder_layer_input=device,query_proj=remat,key_proj=remat,value_proj=remat",
                vocab_tiles=16, slices=slices, splash_blocks=_GEMMA3_SPLASH_BLOCKS,
            ),
        )
        for slices, folder, config, tflops in (
            (1, "v6e-256", "gemma3_12b_32768_v6e256", 349.442),
            (2, "2x-v6e-256", "gemma3_12b_32768_2x_v6e256", 328.139),
            (4, "4x-v6e-256", "gemma3_12b_32768_4x_v6e256", 304.788),
        )
    ),
    Published(
        "mistral-7b", "TPU v6e", 8, 0.4706,
        "MaxText on v6e-8, FSDP over 8 chips, per-device batch 6 x 8192 tokens, splash attention in blocks of 2048 "
        "with the fused backward kernel, remat custom (the layer input and q/k/v/out projections offloaded to host)",
        "tpu-recipes training/trillium/Mistral-7B-MaxText (MaxText tpu-recipes-v0.1.2, mistral_7b)", 431.981,
        # its step log: 6.320 s, 7,776.813 tokens/s a device; sa_block_* all 2048, sa_use_fused_bwd_kernel
        Recipe(
            "v6e-8", FSDP, ((FSDP, 8),), 6, 8192, _V6E_8B_REMAT, vocab_tiles=_V6E_VOCAB_TILES,
            splash_blocks=_V6E_BLOCKS_2048_FUSED, scoped_vmem_kib=_V6E_SCOPED_VMEM_KIB,
        ),
        counts_attention_whole=True,
    ),
    Published(
        "llama2-70b", "TPU v5p", 256, 0.654,
        "MaxText on v5p-512, FSDP over 256 chips, per-device batch 4 x 4096 tokens, flash attention, remat "
        "save_dot_except_mlpwi",
        "maxtext docs/reference/models/tiering.md; MaxText/configs/v5p/llama2_70b.sh", None,
        # tiering.md's 692 tokens/s a chip are 296 TFLOP/s with causal attention halved, 308 counted
        # whole; its MFU (300 over v5p's 459) fits neither: taken as published, in the planner's count
        Recipe("v5p-512", FSDP, ((FSDP, 256),), 4, 4096, "save_dot_except_mlp"),
    ),
    Published(
        "gpt3-175b", "TPU v6e", 256, round(384.891e12 / CHIP_SPECS["v6e"].peak_flops, 4),
        "MaxText on v6e-256, FSDP over 256 chips, per-device batch 3 x 2048 tokens, splash attention (query "
        "blocks of 1024, 2048 in backward), remat full",
        "tpu-recipes training/trillium/GPT3-175B-MaxText/bf16 (MaxText tpu-recipes-v0.1.2, gpt_3_175b_bf16)", 384.891,
        # its step log: 17.182 s, 357.580 tokens/s a device, total_weights 1,572,864 (3 x 2048 a device)
        Recipe(
            "v6e-256", FSDP, ((FSDP, 256),), 3, 2048, "full",
            splash_blocks=_V6E_BLOCKS_QUERY_1024, scoped_vmem_kib=_V6E_SCOPED_VMEM_KIB,
        ),
        counts_attention_whole=True,
    ),
    Published(
        "llama2-70b", "TPU v6e", 256, round(402.274e12 / CHIP_SPECS["v6e"].peak_flops, 4),
        "MaxText on v6e-256, FSDP over 256 chips (fsdp_transpose), per-device batch 2 x 4096 tokens, splash "
        "attention (query blocks of 1024, 2048 in backward), remat qkv_proj_offloaded (q, k and v offloaded to host)",
        "tpu-recipes training/trillium/Llama2-70B-MaxText (MaxText tpu-recipes-v0.1.2, llama2_70b_4096_sc)", 402.274,
        # its step log: 9.052 s, 905.021 tokens/s a device, total_weights 2,097,152: 2 sequences a
        # device ran, where the config beside it says per_device_batch_size 3; planned as it ran.
        # MaxText shards each weight's other dim (ici_fsdp_transpose_parallelism=-1), the planner's
        # FSDP its first: the same bytes
        Recipe(
            "v6e-256", FSDP, ((FSDP, 256),), 2, 4096, _QKV_PROJ_OFFLOADED,
            splash_blocks=_V6E_BLOCKS_QUERY_1024, scoped_vmem_kib=_V6E_SCOPED_VMEM_KIB,
        ),
        counts_attention_whole=True,
    ),
)  # fmt: skip


def _one_slice(model: str, topology: str) -> Published | None:
    return next(
        (
            p
            for p in _ONE_SLICE
            if p.model == model and p.recipe and (p.recipe.topology, p.recipe.slices) == (topology, 1)
        ),
        None,
    )


def _on_more_slices(model: str, topology: str, slices: int, mfu: float, tflops_per_chip: float) -> Published:
    """The row of MaxText's README for its one-slice recipe of ``model`` on ``topology`` run on
    ``slices`` slices: the slices joined by DCN data parallelism (MaxText's default
    ``dcn_data_parallelism=-1``), everything else as on one."""
    one = _one_slice(model, topology)
    assert one is not None and one.recipe is not None  # every row of _MORE_SLICES has its one-slice recipe
    recipe = one.recipe
    return replace(
        one,
        chips=one.chips * slices,
        mfu=mfu,
        setup=f"{one.setup}, {slices} slices (DCN data parallelism)",
        source=_maxtext_readme(slices, topology),
        tflops_per_chip=tflops_per_chip,
        recipe=replace(recipe, mesh=((DCN_PREFIX + Role.DATA.value, slices), *recipe.mesh), slices=slices),
    )


# MaxText's READMEs' rows of their recipes on more slices: (model, the slice, slices, MFU, TFLOP/s per chip).
_MORE_SLICES = (
    ("maxtext-64b", "v5p-128", 2, 0.6726, 309.0),
    ("maxtext-128b", "v5p-256", 2, 0.6634, 305.0),
    ("maxtext-128b", "v5p-512", 2, 0.5966, 274.0),
    ("maxtext-256b", "v5p-1024", 2, 0.6299, 289.0),
    ("maxtext-16b", "v5e-256", 2, 0.5937, 117.0),
    ("maxtext-16b", "v5e-256", 4, 0.5914, 117.0),
    ("maxtext-16b", "v5e-256", 8, 0.5827, 115.0),
    ("maxtext-16b", "v5e-256", 16, 0.5656, 111.0),
    ("maxtext-16b", "v5e-256", 32, 0.5465, 108.0),
    ("maxtext-32b", "v5e-256", 2, 0.6481, 128.0),
    ("maxtext-32b", "v5e-256", 4, 0.6410, 126.0),
    ("maxtext-32b", "v5e-256", 8, 0.6367, 125.0),
    ("maxtext-32b", "v5e-256", 16, 0.6226, 123.0),
    ("maxtext-32b", "v5e-256", 32, 0.6040, 119.0),
    ("maxtext-64b", "v5e-256", 2, 0.5666, 112.0),
    ("maxtext-64b", "v5e-256", 4, 0.5585, 110.0),
    ("maxtext-64b", "v5e-256", 8, 0.5496, 108.0),
    ("maxtext-64b", "v5e-256", 16, 0.5329, 105.0),
    ("maxtext-64b", "v5e-256", 32, 0.5018, 99.0),
    ("maxtext-128b", "v5e-256", 2, 0.5582, 110.0),
    ("maxtext-128b", "v5e-256", 4, 0.5493, 108.0),
    ("maxtext-128b", "v5e-256", 8, 0.5293, 104.0),
    ("maxtext-128b", "v5e-256", 16, 0.5086, 100.0),
    ("maxtext-128b", "v5e-256", 32, 0.4625, 91.0),
)
PUBLISHED: tuple[Published, ...] = _ONE_SLICE + tuple(_on_more_slices(*row) for row in _MORE_SLICES)


def published_for(
    model: str,
    chip: str,
    chips: int,
    seq_len: int | None = None,
    slices: int | None = None,
    strategy: str | None = None,
) -> Published | None:
    """The published run of ``model`` on ``chips`` chips of ``chip`` (a `ChipSpec.name`), if any;
    with ``seq_len``, one at that sequence length, and with ``slices``, one on that many slices
    (either: or of no known recipe). Llama 3.1-70B on 256 Ironwood chips is published at 131,072
    tokens, which says nothing of a plan at 8,192; MaxText's 64B on 2 x v5p-128 says nothing of
    one v5p-256. Where several match, the one whose recipe runs ``strategy`` comes first (the
    405B on 2 x v6e-256 is published pure FSDP and FSDP x tensor)."""
    found = [
        p
        for p in PUBLISHED
        if (p.model, p.chip, p.chips) == (model, chip, chips)
        and (seq_len is None or p.recipe is None or p.recipe.seq_len == seq_len)
        and (slices is None or p.recipe is None or p.recipe.slices == slices)
    ]
    same = [p for p in found if strategy is not None and p.recipe is not None and p.recipe.strategy == strategy]
    return (same or found or [None])[0]


def published_run(name: str) -> Published:
    """The published run called ``name`` (`run_name`: ``llama3.1-70b@tpu7x-128``)."""
    found = next((p for p in PUBLISHED if p.recipe is not None and run_name(p) == name), None)
    if found is None:
        known = [run_name(p) for p in PUBLISHED if p.recipe is not None]
        raise KeyError(f"No published run with a recipe is called {name!r}; known: {known}.")
    return found


def run_name(p: Published) -> str:
    """``model@topology`` of a run with a recipe (``maxtext-32b@v5p-128``; ``llama3.1-405b@2xv6e-256``
    across slices; ``llama3.1-405b@2xv6e-256:fsdp64xtensor4`` for a second recipe of the same shape)."""
    if p.recipe is None:
        return f"{p.model}@{p.chips}x{p.chip}"
    slices = f"{p.recipe.slices}x" if p.recipe.slices > 1 else ""
    return f"{p.model}@{slices}{p.recipe.topology}" + (f":{p.variant}" if p.variant else "")


def slice_scaling(p: Published) -> SliceScaling | None:
    """A run on several slices beside its recipe's run on one: its published TFLOP/s per chip over
    the one slice's (`spmd.plan.predict._calibration.SliceScaling`, what the slice term is fitted
    on); ``None`` for a run on one slice, or with no one-slice run of its recipe published."""
    if p.recipe is None or p.recipe.slices < 2 or not p.tflops_per_chip:
        return None
    one = _one_slice(p.model, p.recipe.topology)
    if one is None or not one.tflops_per_chip:
        return None
    return SliceScaling(run_name(p), p.recipe.slices, p.tflops_per_chip / one.tflops_per_chip)
