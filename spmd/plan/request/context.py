"""Context parallelism in the planned step: the sequence split over the ``context`` axis, as
MaxText runs it by default (``context_parallel_strategy: all_gather``,
``context_parallel_load_balance: True``; MaxText ``layers/attention_op.py``, ``utils/max_utils.py``).

- **Load balancing.** The sequence is cut into ``2 x context`` chunks and context shard ``i`` holds
  chunks ``i`` and ``2 x context - 1 - i`` (MaxText's ``reorder_sequence``, "dual chunk swap"): under
  a causal mask an early chunk attends to few keys and a late one to many, so each shard gets one of
  each and every shard does the same work. MaxText's input pipeline reorders the tokens, targets
  and positions so; the planner's tokens are abstract, so only the positions are reordered
  (`load_balanced_order`, the model's ``position_ids``: its rotary embedding sees each token's true
  position).
- **Attention** (`context_attention`). The queries stay sharded by sequence; the keys and values
  are all-gathered over the context axis in each layer (their gradients reduce-scattered in
  backward: the all-gather's transpose), put back into contiguous order (`to_contiguous`, as
  MaxText does), and splash attention runs the local queries against the whole sequence. Its
  causal mask compares each query's true position with each key's (`load_balanced_causal_mask`: a
  splash ``CausalMask`` whose rows are the load-balanced positions, built for ``context``
  query shards (``q_seq_shards``) so that each shard's kernel reads its own rows' mask).

Parameters are sharded over ``fsdp`` x ``context`` (`mesh.roles.param_shard_axes`: context
devices shard parameters too, as torchtitan and MaxText do), and gathered over both at use.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from spmd.mfu.flops import sliding_layers
from spmd.plan.errors import PlanError

__all__ = [
    "axes_spanned",
    "check_context",
    "check_no_sliding_window",
    "check_takes_positions",
    "context_attention",
    "context_positions",
    "context_size",
    "context_token_loss",
    "kv_gather_bytes",
    "load_balanced_causal_mask",
    "load_balanced_order",
    "to_contiguous",
]

_LANES = 128  # a TPU vector register's lanes: splash's blocks are multiples of it


def check_context(seq_len: int, context: int) -> None:
    """Raise `PlanError` unless ``seq_len`` splits into the ``2 x context`` equal chunks load
    balancing needs, each shard's ``seq_len / context`` tokens a multiple of 128 (splash's blocks)."""
    if context <= 1:
        return
    if seq_len % (2 * context):
        raise PlanError(
            f"Context parallelism over context={context} load-balances the sequence in 2 x {context} = "
            f"{2 * context} equal chunks (MaxText's context_parallel_load_balance); --seq {seq_len} does not "
            f"split so. Give a sequence divisible by {2 * context}, or a context size whose double divides {seq_len}."
        )
    if (seq_len // context) % _LANES:
        raise PlanError(
            f"Context parallelism over context={context} leaves {seq_len // context} tokens a shard, not a multiple "
            f"of {_LANES} (splash attention's blocks). Give a sequence divisible by {context * _LANES}, or a smaller "
            "context axis."
        )


def load_balanced_order(seq_len: int, context: int) -> np.ndarray:
    """The positions of the sequence in the order the context shards hold them (module docstring):
    for ``seq_len=8, context=2``, ``[0 1 6 7 2 3 4 5]`` (MaxText's ``reorder_sequence``)."""
    chunk = seq_len // (2 * context)
    order = [c for i in range(context) for c in (i, 2 * context - 1 - i)]
    return np.concatenate([np.arange(c * chunk, (c + 1) * chunk, dtype=np.int32) for c in order])


def to_contiguous(x: Any, context: int, axis: int) -> Any:
    """``x``, whose ``axis`` is a sequence in load-balanced order (an all-gather of the shards), in
    position order: chunk ``2i`` of the gathered order is position chunk ``i``, chunk ``2i + 1`` is
    ``2 x context - 1 - i`` (MaxText's ``reorder_sequence(..., to_contiguous=True)``)."""
    import jax.numpy as jnp

    shape = x.shape
    pairs = x.reshape(*shape[:axis], context, 2, shape[axis] // (2 * context), *shape[axis + 1 :])
    first = jnp.take(pairs, 0, axis=axis + 1)  # chunks 0 .. context - 1
    second = jnp.flip(jnp.take(pairs, 1, axis=axis + 1), axis=axis)  # chunks context .. 2 context - 1
    return jnp.concatenate([first, second], axis=axis).reshape(shape)


def kv_gather_bytes(batch_per_shard: int, kv_heads: int, seq_len: int, head_dim: int, itemsize: int = 2) -> int:
    """Bytes of one layer's gathered K (or V) on a device: ``batch x kv_heads x seq x head_dim``
    in the compute dtype, all-gathered from ``seq / context`` tokens a shard."""
    return batch_per_shard * kv_heads * seq_len * head_dim * itemsize


@functools.cache
def _mask_class() -> type:
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    class LoadBalancedCausal(masks.CausalMask):
        """A causal mask whose rows are queries in load-balanced order (MaxText's
        ``LoadBalancedCausalMask``): row ``r`` is the query at position ``q_sequence[r]``, and it
        sees key ``j`` (keys in position order) when ``q_sequence[r] >= j``. Equality and hash
        (the kernel cache's key) include ``q_sequence``, as ``CausalMask``'s do."""

        def __init__(self, seq_len: int, context: int):
            super().__init__((seq_len, seq_len))
            self.q_sequence = load_balanced_order(seq_len, context)

    return LoadBalancedCausal


def load_balanced_causal_mask(seq_len: int, context: int) -> Any:
    """The causal mask of a sequence load-balanced over ``context`` shards (its class is built on
    first use: jax is imported only when a plan needs it)."""
    return _mask_class()(seq_len, context)


@functools.lru_cache(maxsize=8)
def _kernel(heads: int, seq_len: int, context: int, block: int, residual_name: str | None, interpret: bool) -> Any:
    """A splash MHA kernel for ``heads`` local heads over ``context`` query shards. Building one
    processes the whole ``seq x seq`` mask in numpy (about two minutes at 131,072 tokens here), so
    each is built once per process, outside any trace (its mask arrays are constants, which a later
    trace can share)."""
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    sizes = splash.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block, block_kv_dkv=block,
        block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block,
    )  # fmt: skip
    mask = masks.MultiHeadMask([load_balanced_causal_mask(seq_len, context)] * heads)
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha(
            mask, block_sizes=sizes, head_shards=1, q_seq_shards=context, residual_checkpoint_name=residual_name,
            interpret=interpret,
        )  # fmt: skip


def context_attention(
    q: Any, k: Any, v: Any, jax_mesh: Any, batch_axes: tuple[str, ...], context_axis: str, tensor_axis: str | None,
    block: int, residual_name: str | None = None, interpret: bool = False,
) -> Any:  # fmt: skip
    """Causal splash attention of ``[batch, heads, seq, head_dim]`` ``q``, ``k``, ``v`` whose
    sequence is in load-balanced order over ``context_axis`` (module docstring), under
    ``shard_map`` on ``jax_mesh``: the batch over ``batch_axes``, heads over ``tensor_axis``. The
    output is in the queries' order. ``q`` comes scaled; ``block`` is the kernel's block along the
    sequence (a multiple of 128 dividing each shard's ``seq / context`` queries); ``residual_name``
    names the kernel's residuals (its output and log-sum-exp) for a remat policy; ``interpret``
    runs the kernel in Pallas' interpreter (a CPU check)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as JaxSpec

    sizes = dict(zip(jax_mesh.axis_names, jax_mesh.devices.shape))
    context, tensor = sizes[context_axis], sizes.get(tensor_axis, 1) if tensor_axis else 1
    heads, seq_len = q.shape[1], q.shape[2]
    check_context(seq_len, context)
    kernel = _kernel(heads // tensor, seq_len, context, block, residual_name, interpret)
    kernel_spec = kernel.manual_sharding_spec(NamedSharding(jax_mesh, JaxSpec(None, context_axis)))
    spec = JaxSpec(batch_axes or None, tensor_axis if tensor > 1 else None, context_axis, None)

    def local(kernel: Any, q: Any, k: Any, v: Any) -> Any:
        # K and V of the whole sequence: an all-gather over the context axis, whose transpose
        # (backward) reduce-scatters their gradients; then position order for the mask's columns
        k, v = (to_contiguous(jax.lax.all_gather(t, context_axis, axis=2, tiled=True), context, 2) for t in (k, v))
        return jax.vmap(kernel)(q, k, v)

    return jax.shard_map(
        local, mesh=jax_mesh, in_specs=(kernel_spec, spec, spec, spec), out_specs=spec, check_vma=False
    )(kernel, q, k, v)


def check_takes_positions(model: Any) -> None:
    """Raise `PlanError` unless ``model.forward`` takes ``position_ids``: a context-parallel step
    gives each token its true position so (module docstring), and a model that cannot take them
    would compute with the shards' order as positions."""
    import inspect

    try:
        takes = "position_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        raise PlanError(
            f"Context parallelism gives the model each token's position (the shards hold the sequence "
            f"load-balanced), as position_ids; {type(model).__name__}.forward takes no position_ids. Plan a model "
            "whose forward does (Hugging Face causal LMs), or plan it without a context axis."
        )


def check_no_sliding_window(model: Any, seq_len: int) -> None:
    """Raise `PlanError` when ``model`` (a Hugging Face causal LM) has layers attending over a
    sliding window shorter than ``seq_len``: the context-parallel kernel is causal attention over
    the whole sequence (module docstring)."""
    config = getattr(model, "config", None)
    # the windows its attention modules hand on: Gemma's and Qwen2's hold their own, Mistral's read the config
    windows = [w for m in model.modules() if isinstance(w := getattr(m, "sliding_window", None), int)]
    if config is not None and (configured := sliding_layers(config, getattr(config, "num_hidden_layers", 0))[0]):
        windows.append(configured)
    window = min(windows, default=None)
    if window is not None and window < seq_len:
        raise PlanError(
            f"Context parallelism plans causal attention over the whole sequence; {type(model).__name__}'s layers "
            f"attend over a sliding window of {window} tokens (its config's sliding_window), which the load-balanced "
            "kernel does not take. Plan it without a context axis: drop context from --mesh (e.g. --mesh fsdp=N), and "
            "--strategy cp if given."
        )


def context_positions(jax_mesh: Any, seq_len: int, sequence_axes: tuple[str, ...], model: Any) -> Any:
    """``[1, seq]`` int32 positions in load-balanced order, split over ``sequence_axes`` as the
    tokens are: the ``position_ids`` of a context-parallel step (module docstring)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as JaxSpec

    check_takes_positions(model)
    sizes = dict(zip(jax_mesh.axis_names, jax_mesh.devices.shape))
    order = load_balanced_order(seq_len, math.prod(sizes[a] for a in sequence_axes))
    spec = JaxSpec(None, sequence_axes if len(sequence_axes) > 1 else sequence_axes[0])
    return jax.lax.with_sharding_constraint(jnp.asarray(order)[None, :], NamedSharding(jax_mesh, spec))


def context_token_loss(logits: Any, targets: Any) -> Any:
    """Mean token cross-entropy of ``[batch, seq, vocab]`` logits against ``targets`` (MaxText's
    pipeline gives the targets shifted: the planner's tokens stand for them, a compile needs no
    values). Written on the ``[batch, seq]`` grid, so each shard reduces its own tokens: a Hugging
    Face model's loss flattens batch and sequence into one dim, across which the partitioner
    gathered the logits of a whole sequence on every context shard (on a small Llama, 8 MiB of
    fp32 logits a step; at 131,072 tokens and Llama 3's vocabulary, 63 GiB a device)."""
    import jax
    import jax.numpy as jnp

    x = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(x, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(x, axis=-1) - picked)


def axes_spanned(group: tuple[int, ...], mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]) -> tuple[str, ...]:
    """The mesh axes a collective's replica group spans: those along which its members' positions
    differ (the HLO names devices by their position in the mesh, row-major over its axes)."""
    if not group or max(group) >= math.prod(mesh_shape):
        return ()
    coords = np.array(np.unravel_index(np.asarray(group), mesh_shape)).T
    return tuple(name for k, name in enumerate(axis_names) if len(set(coords[:, k])) > 1)


def context_size(jax_mesh: Any, context_axis: str | None) -> int:
    """The size of ``context_axis`` on ``jax_mesh`` (1: no such axis)."""
    if not context_axis:
        return 1
    return math.prod(s for n, s in zip(jax_mesh.axis_names, jax_mesh.devices.shape) if n == context_axis)
