"""``--attention``: what the planned step runs for the model's ``scaled_dot_product_attention``.

- ``dot``: torchax's lowering of ``torch.nn.functional.scaled_dot_product_attention``, which
  materializes the ``batch x heads x seq x seq`` scores (as torch's math kernel does).
- ``flash``: the kernel TPU training runs, JAX's Pallas splash attention
  (``jax.experimental.pallas.ops.tpu.splash_attention``, ``make_splash_mha``), compiled by libtpu
  into a ``tpu_custom_call`` that holds no S x S tensor. It runs under ``shard_map``: the batch
  split over the batch axes, the heads over ``tensor`` (the 2-D plan's), as MaxText runs it.

The model's own attention reaches it unchanged: the planner overrides torchax's
``scaled_dot_product_attention`` in the plan's ``Environment`` (`route_attention`), so any torch
module calling it (Hugging Face's ``sdpa`` attention, GPT-2, Llama) runs the kernel. Splash takes
a causal or a full mask, no dropout, and grouped K/V heads natively. A model that passes an
explicit mask tensor cannot be planned with ``flash`` (`TracingError`, naming the fix).

Sliding windows (Gemma 3's local layers, Mistral's ``sliding_window``): a Hugging Face
attention module hands its window to its attention function (``sliding_window=``). Under
``flash`` the kernel takes it as splash's local mask, which skips the blocks outside the window
(MaxText's ``sliding_window_size``); under ``dot`` the scores are masked to it. Each windowed
kernel runs under the name scope ``splash_window_<W>_blocks_...`` (`window_scope`, with its block
sizes) so the step-time model costs the blocks the window reaches, not the causal triangle
(`spmd.plan.predict._op_costs.splash_window`). The block sizes are MaxText's ``sa_block_*``
(`spmd.plan.request.splash_blocks`).

Measured with jax 0.10.2 and libtpu 0.0.52 on ``tpu7x:2x2x1`` at batch 8, 16 heads, seq 2048,
head dim 128, forward and backward: the kernel compiles in 0.8 s with 24 MiB of temporaries;
dot attention takes 6.5 s and 388 MiB (issue 19).
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mesh import Role
from spmd.plan._jax_compat import override_function
from spmd.plan.errors import PlanError, TracingError
from spmd.plan.request.splash_blocks import PLANNER_BLOCKS, SplashBlocks, splash_block

__all__ = [
    "FUSED_BACKWARD_SCOPE",
    "PHASE_BLOCKS",
    "WINDOW_SCOPE",
    "Attention",
    "causal_without_mask",
    "route_attention",
    "splash_block",
    "splash_mask",
    "window_mask",
    "window_scope",
]

# The name scope a windowed kernel runs under: ``splash_window_1024_blocks_...`` (`window_scope`).
WINDOW_SCOPE = "splash_window_"
# Each splash kernel's (query, key) block sizes by its pass, as `SplashBlocks` names them (jax's
# ``BlockSizes`` prefixes ``block_``): forward, the key gradient, the query gradient, in that order.
PHASE_BLOCKS = {"fwd": ("q", "kv"), "dkv": ("q_dkv", "kv_dkv"), "dq": ("q_dq", "kv_dq")}
# The name scope a fused backward kernel runs under (`spmd.plan.request.splash_blocks`): jax 0.12
# names that kernel as the unfused key gradient's, so the step-time model reads this instead.
FUSED_BACKWARD_SCOPE = "splash_fused_bwd"
# The sliding window of the attention call being traced (None: every earlier key), from the model's
# attention module to the kernel (`causal_without_mask`, `route_attention`).
_WINDOW: contextvars.ContextVar[int | None] = contextvars.ContextVar("xla_spmd_sdpa_window", default=None)


class Attention(enum.Enum):
    """The attention the planned step runs (module docstring)."""

    DOT = "dot"
    FLASH = "flash"

    @classmethod
    def parse(cls, value: str | Attention) -> Attention:
        if isinstance(value, Attention):
            return value
        try:
            return cls(value)
        except ValueError:
            raise PlanError(f"attention must be one of {[a.value for a in cls]}, got {value!r}.") from None


@functools.lru_cache(maxsize=16)
def _kernel(
    heads: int, seq_len: int, causal: bool, residual_name: str | None, window: int | None,
    sizes: tuple[tuple[str, int], ...], fused_backward: bool = False,
) -> Any:  # fmt: skip
    """A splash MHA kernel for ``heads`` local heads (masks are numpy work: build each once);
    ``residual_name`` names its residuals for a remat policy (``None``: unnamed); ``window``: each
    query sees that many keys, itself included (splash's local mask), ``None``: all before it;
    ``sizes``: its block sizes by name (`SplashBlocks.resolved`, without `SplashBlocks.unused`);
    ``fused_backward``: one backward kernel."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    one = splash_mask(seq_len, causal, window)
    block_sizes = splash.BlockSizes(
        **{f"block_{name}": size for name, size in sizes}, use_fused_bwd_kernel=fused_backward
    )
    return splash.make_splash_mha(
        masks.MultiHeadMask([one] * heads), block_sizes=block_sizes, head_shards=1, q_seq_shards=1,
        residual_checkpoint_name=residual_name,
    )  # fmt: skip


def window_scope(window: int, sizes: dict[str, int]) -> str:
    """The name scope a kernel over a ``window`` runs under, with its resolved block sizes
    (`SplashBlocks.resolved`): ``splash_window_1024_blocks_512x512_512x512_512x512``, the query
    and key blocks of forward, the key gradient and the query gradient."""
    return f"{WINDOW_SCOPE}{window}_blocks_" + "_".join(f"{sizes[q]}x{sizes[k]}" for q, k in PHASE_BLOCKS.values())


@contextlib.contextmanager
def _kernel_scopes(window: int | None, sizes: dict[str, int], fused_backward: bool) -> Iterator[None]:
    """The name scopes a kernel's cost is read from (`spmd.plan.predict._op_costs`): its window
    with its blocks (`window_scope`), and a fused backward (jax 0.12 names it as the unfused key
    gradient's kernel)."""
    import jax

    with contextlib.ExitStack() as scopes:
        if window is not None:
            scopes.enter_context(jax.named_scope(window_scope(window, sizes)))
        if fused_backward:
            scopes.enter_context(jax.named_scope(FUSED_BACKWARD_SCOPE))
        yield


def splash_mask(seq_len: int, causal: bool, window: int | None) -> Any:
    """One head's splash mask: causal or full, or each query's last ``window`` keys (itself
    included; both sides of it when not ``causal``), as Hugging Face's sliding-window mask."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    shape = (seq_len, seq_len)
    if window is not None:
        return masks.LocalMask(shape, window_size=(window - 1, 0 if causal else window - 1), offset=0)
    return masks.CausalMask(shape) if causal else masks.FullMask(shape)


def window_mask(queries: int, keys: int, window: int, device: Any = None) -> torch.Tensor:
    """``[1, 1, queries, keys]``: True where a query sees a key, causal over its last ``window``
    keys, itself included (``dot`` attention's sliding window)."""
    seen = torch.ones(queries, keys, dtype=torch.bool, device=device)
    return seen.tril().triu(1 - window)[None, None]


def _check_call(query: Any, key: Any, attn_mask: Any, dropout_p: float) -> None:
    if attn_mask is not None:
        raise TracingError(
            "The model passes an explicit attention mask to scaled_dot_product_attention; splash attention "
            "(--attention flash) takes a causal or full mask only. Call the model without attention_mask / "
            "padding (the planner passes none), or plan with --attention dot."
        )
    if dropout_p:
        raise TracingError(
            f"scaled_dot_product_attention with dropout_p={dropout_p}: splash attention has no dropout. Set the "
            "model's attention dropout to 0 (a training run on TPU does), or plan with --attention dot."
        )
    if query.ndim != 4 or key.shape[2] != query.shape[2]:
        raise TracingError(
            f"--attention flash takes [batch, heads, seq, head_dim] queries and keys of one length; got query "
            f"{tuple(query.shape)}, key {tuple(key.shape)}. Plan this model with --attention dot."
        )


def route_attention(
    env: Any, jax_mesh: Any, batch_axes: tuple[str, ...], context_axis: str | None = None,
    residual_name: str | None = None, blocks: SplashBlocks = PLANNER_BLOCKS,
) -> list[tuple[int, ...]]:  # fmt: skip
    """Make ``env`` (a torchax ``Environment``) run ``scaled_dot_product_attention`` as splash
    attention under ``shard_map`` on ``jax_mesh``: batch over ``batch_axes``, heads over
    ``tensor`` when the mesh has it, and with a ``context_axis`` the sequence over it
    (`spmd.plan.request.context.context_attention`). ``residual_name`` names the kernel's
    residuals (its output and log-sum-exp) for a remat policy that keeps them; ``blocks``: the
    kernel's block sizes (`spmd.plan.request.splash_blocks`; a context axis's kernel keeps its
    own). Returns the list each call appends its query shape to (a model that never calls it gets
    no kernel)."""
    calls: list[tuple[int, ...]] = []
    sdpa = _splash_sdpa(env, jax_mesh, batch_axes, calls, context_axis, residual_name, blocks)
    override_function(env, torch.nn.functional.scaled_dot_product_attention, sdpa)
    return calls


_NO_MASK = "xla_spmd_sdpa_no_mask"


@contextlib.contextmanager
def causal_without_mask(model: torch.nn.Module, window_as_mask: bool) -> Iterator[None]:
    """For a Hugging Face model on ``sdpa`` attention: inside, its attention runs Hugging Face's
    own ``sdpa_attention_forward`` under a name of the planner's that has no mask function, so it
    builds no mask tensor and calls ``scaled_dot_product_attention(..., is_causal=True)``.

    That is what the model does in training with no padding (on torch_xla too): Hugging Face sees
    that the sequences are not packed and skips the mask. On JAX tracers it cannot see that, and
    builds a ``batch x seq x seq`` mask (which splash attention cannot take). Other models are
    left as they are.

    A layer with a sliding window keeps it: ``window_as_mask`` (``dot`` attention) masks the
    scores to the window; otherwise the window reaches the splash kernel (`route_attention`)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attend(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN202
        window = kwargs.get("sliding_window")
        if window is not None and window >= key.shape[-2]:
            window = None  # the window holds the whole sequence: plain causal attention
        if window is not None and window_as_mask:
            attention_mask = window_mask(query.shape[-2], key.shape[-2], window, query.device)
        token = _WINDOW.set(None if window_as_mask else window)
        try:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        finally:
            _WINDOW.reset(token)

    AttentionInterface.register(_NO_MASK, attend)
    config._attn_implementation = _NO_MASK
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


def _splash_sdpa(
    env: Any, jax_mesh: Any, batch_axes: tuple[str, ...], calls: list[tuple[int, ...]], context_axis: str | None,
    residual_name: str | None, blocks: SplashBlocks,
) -> Callable[..., Any]:  # fmt: skip
    import jax
    from jax.sharding import PartitionSpec as JaxSpec

    from spmd.plan.request.context import context_attention, context_size

    tensor = dict(zip(jax_mesh.axis_names, jax_mesh.devices.shape)).get(Role.TENSOR.value, 1)
    tensor_axis = Role.TENSOR.value if tensor > 1 else None
    sharded_sequence = context_size(jax_mesh, context_axis) > 1

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):  # noqa: ANN001, ANN202
        _check_call(query, key, attn_mask, dropout_p)
        calls.append(tuple(query.shape))
        q, k, v = env.t2j_iso((query, key, value))
        heads, kv_heads, seq_len, head_dim = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
        if heads % tensor or kv_heads % tensor:
            raise PlanError(
                f"tensor={tensor} does not divide the {heads} query heads and {kv_heads} key/value heads that splash "
                "attention splits over it. Pick a tensor size dividing both, or --attention dot."
            )
        splash_block(seq_len)
        q = q * (scale if scale is not None else 1 / math.sqrt(head_dim))
        if sharded_sequence:  # the sequence split over the context axis: load-balanced causal attention
            if _WINDOW.get() is not None:  # `plan` refuses such a model first (`check_no_sliding_window`)
                raise TracingError(
                    "Context parallelism plans causal attention over the whole sequence, not a sliding window."
                )
            if not is_causal:
                raise TracingError(
                    "Context parallelism plans causal attention (a decoder's), whose load-balanced mask it builds; "
                    "this model calls scaled_dot_product_attention with is_causal=False. Plan it without a "
                    "context axis."
                )
            block = splash_block(seq_len // context_size(jax_mesh, context_axis))  # each shard's queries
            out = context_attention(q, k, v, jax_mesh, batch_axes, context_axis, tensor_axis, block, residual_name)  # type: ignore[arg-type]
            return env.j2t_iso(out.astype(q.dtype))
        spec = JaxSpec(batch_axes or None, tensor_axis, None, None)
        window = _WINDOW.get()
        sizes = blocks.resolved(seq_len)
        fused = blocks.use_fused_bwd_kernel
        taken = tuple((name, size) for name, size in sizes.items() if name not in blocks.unused)
        kernel = _kernel(heads // tensor, seq_len, bool(is_causal), residual_name, window, taken, fused)

        def local(q, k, v):  # noqa: ANN001, ANN202
            return jax.vmap(kernel)(q, k, v)

        with _kernel_scopes(window, sizes, fused):
            out = jax.shard_map(local, mesh=jax_mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(
                q, k, v
            )
        return env.j2t_iso(out.astype(q.dtype))

    return sdpa
