"""The training step of a meta-device torch model as a JAX function over abstract sharded arrays.

Nothing here allocates a parameter: the model is built on the ``meta`` device, its parameters
become ``jax.ShapeDtypeStruct`` values carrying a ``NamedSharding``, and ``torchax`` runs the
module's own ``forward`` on JAX tracers, in an ``Environment`` of the plan's own (where
``--attention flash`` routes ``scaled_dot_product_attention``, `spmd.plan.request.attention`). Only
buffers (rotary tables, masks) are real.

The step is what `fsdp_xla.FSDP` runs: forward, token cross-entropy, backward, AdamW with master
weights in ``weight_dtype`` (fp32 by default, bf16 as MaxText's ``weight_dtype``) and moments
stored like the parameters. FSDP units are the repeated blocks of the
model; each gathers its parameters at use (a sharding constraint to the spec without the
``fsdp`` axis), so XLA keeps one unit gathered at a time, as our GSPMD wrapper does. What a block
keeps for backward is the ``--remat`` policy (`spmd.plan.request.remat`, `spmd.plan.request.custom_remat`). The
residual stream between blocks is laid out by MaxText's activation rules
(`spmd.logical_axes.ACTIVATION_AXIS_RULES`: on a 2-D mesh its width over ``tensor``), and with
``vocab_tiles`` the loss runs in chunks of tokens (`spmd.plan.request.vocab_tiling`).

The repeated blocks run as one ``lax.scan`` over parameters stacked on a leading layer dim
(MaxText's ``scan_layers``, torch_xla's ``scan_layers``): the TPU compiler then compiles one
block instead of L, which is what makes a 32-layer model plan in minutes (an unrolled 12-layer
GPT-2 took 167 s on this machine). Per-device bytes are those of the unrolled program: a
stacked array is sharded on the same dims as each of its layers. A stack of several kinds of
block (Gemma 3's sliding-window and global layers) scans one period of its pattern a trip
(`spmd.plan.lower.layer_period`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mesh import Mesh, Role
from spmd._util.torch_compat import reparametrize_module
from spmd.errors import ShardingError
from spmd.logical_axes import ACTIVATION_AXIS_RULES, RESIDUAL
from spmd.plan._jax_compat import import_torchax, mosaic_ir_for_libtpu
from spmd.plan.errors import TracingError
from spmd.plan.lower.layer_period import PeriodCalls, PeriodLayer, layer_period
from spmd.plan.lower.residuals import (
    SavedActivation,
    in_layer_scan,
    named_projections,
    row_major_names,
    saved_residuals,
)
from spmd.plan.request.attention import Attention, causal_without_mask, route_attention
from spmd.plan.request.context import context_positions, context_token_loss
from spmd.plan.request.fused_projections import fused_projections, fusion_groups
from spmd.plan.request.remat import BLOCK_INPUT, Remat, jax_policy, kernel_residual_name
from spmd.plan.request.splash_blocks import PLANNER_BLOCKS, SplashBlocks
from spmd.plan.request.vocab_tiling import hidden_states_only, output_head, tiled_token_loss
from spmd.sharding import P, PartitionSpec

__all__ = ["LoweredStep", "TrainStepConfig", "find_layer_stack", "lower_train_step", "to_jax_spec"]


@dataclass(frozen=True)
class TrainStepConfig:
    """What the compiled step does.

    Attributes:
        global_batch: sequences per step over all devices.
        seq_len: tokens per sequence.
        compute_dtype: ``"bfloat16"`` (parameters cast at use) or ``"float32"``.
        remat: what each block keeps for backward (`Remat`).
        attention: what ``scaled_dot_product_attention`` runs (`Attention`).
        batch_axes: mesh axes the batch dim is split over.
        gather_axes: mesh axes a block's parameters are gathered over at use (FSDP's).
        moment_dtype: AdamW's first moment, ``float32`` or ``bfloat16`` (MaxText's ``mu_dtype``).
        learning_rate, weight_decay, betas, eps: AdamW's.
        sequence_axes: mesh axes the sequence is split over (``context``: `spmd.plan.request.context`).
        vocab_tiles: chunks the loss is computed in (`spmd.plan.request.vocab_tiling`; 1: the model's own loss).
        splash_blocks: the splash kernel's block sizes under ``flash`` (`spmd.plan.request.splash_blocks`).
        weight_dtype: the stored parameters and AdamW's second moment (MaxText's ``weight_dtype``);
            the update is computed in fp32 and stored back in it.
        fused: sibling projections run as one matmul (``qkv``, ``mlp``:
            `spmd.plan.request.fused_projections`).
    """

    global_batch: int
    seq_len: int
    compute_dtype: str = "bfloat16"
    remat: Remat = Remat.DOTS
    attention: Attention = Attention.DOT
    batch_axes: tuple[str, ...] = (Role.FSDP.value,)
    gather_axes: tuple[str, ...] = (Role.FSDP.value,)
    moment_dtype: str = "float32"
    learning_rate: float = 1e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    sequence_axes: tuple[str, ...] = ()
    vocab_tiles: int = 1
    splash_blocks: SplashBlocks = PLANNER_BLOCKS
    weight_dtype: str = "float32"
    fused: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoweredStep:
    """A lowered step and what went into it.

    Attributes:
        lowered: ``jax.stages.Lowered``; ``.compile()`` runs the target's compiler.
        param_specs: stored spec of every parameter, by its torch name (layer params one by one).
        param_shapes: global shape of every parameter.
        scanned_layers: how many blocks run as one scan (0: unrolled).
        saved_per_layer: what the block scan keeps for backward, one trip's worth (a block's, or
            a period's where the stack scans by periods; global shapes, the layer dim dropped):
            JAX's own residuals of the remat policy (`saved_residuals`).
    """

    lowered: Any
    param_specs: Mapping[str, PartitionSpec]
    param_shapes: Mapping[str, tuple[int, ...]]
    scanned_layers: int
    saved_per_layer: tuple[SavedActivation, ...] = ()


def to_jax_spec(spec: PartitionSpec) -> Any:
    """``spec`` as a ``jax.sharding.PartitionSpec`` (the same entries)."""
    from jax.sharding import PartitionSpec as JaxSpec

    return JaxSpec(*spec)


def _without(spec: PartitionSpec, axes: tuple[str, ...]) -> PartitionSpec:
    out = []
    for entry in spec:
        group = entry if isinstance(entry, tuple) else (entry,) if entry is not None else ()
        kept = tuple(a for a in group if a not in axes)
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return P(*out)


def find_layer_stack(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList] | None:
    """The largest ``ModuleList`` of identically shaped blocks (a transformer's layers), by its
    qualified name; None when the model has none with two or more blocks."""
    best: tuple[str, torch.nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        signatures = {tuple((n, tuple(p.shape), p.dtype) for n, p in block.named_parameters()) for block in module}
        if len(signatures) != 1 or not next(iter(signatures)) or len({type(b) for b in module}) != 1:
            continue
        if best is None or len(module) > len(best[1]):
            best = (name, module)
    return best


class _ScannedLayers(torch.nn.Module):
    """Stands in for a layer ``ModuleList``: one call runs every block as a ``lax.scan``."""

    def __init__(self, template: torch.nn.Module, run_block: Callable[..., Any]):
        super().__init__()
        self.__dict__["template"] = template  # not a submodule: its parameters come from the scan
        self.__dict__["run_block"] = run_block

    def forward(self, hidden: Any, *args: Any, **kwargs: Any) -> Any:
        return self.run_block(hidden, *args, **kwargs)


def lower_train_step(
    model: torch.nn.Module,
    mesh: Mesh,
    jax_devices: np.ndarray,
    param_spec: Callable[[str, tuple[int, ...]], PartitionSpec],
    config: TrainStepConfig,
    scan_layers: bool = True,
) -> LoweredStep:
    """Lower one AdamW training step of ``model`` (on the meta device) for ``jax_devices``.

    Args:
        model: a causal LM whose ``forward(input_ids, labels=...)`` returns ``.loss``, or a
            module returning logits ``[batch, seq, vocab]``; parameters on ``meta``.
        mesh: our mesh; its device ids index ``jax_devices``.
        jax_devices: the target's devices (a TPU topology's, or ``jax.devices()``).
        param_spec: ``(name, shape) -> stored spec`` of each parameter.
        config: batch, sequence, precision, remat, attention and optimizer (`TrainStepConfig`).
        scan_layers: run the repeated blocks as one scan (see the module docstring).

    Raises:
        TracingError: the model's forward cannot run on JAX tracers (the message names why).
    """
    builder = _StepBuilder(model, mesh, np.asarray(jax_devices), param_spec, config, scan_layers)
    try:
        lowered = builder.lower()
    except ShardingError:
        raise
    except Exception as e:  # torchax's OperatorNotFound, jax's tracer errors, the model's own
        first = (str(e).strip().splitlines() or [""])[0][:400]
        raise TracingError(
            f"The planner could not run {type(model).__name__}.forward on JAX tracers (torchax): "
            f"{type(e).__name__}: {first}. The model must run a fixed program: no Python branch on a tensor's "
            "value, no .item() / .tolist(), only ops torchax lowers. Simplify that part of forward, or plan "
            "a model that avoids it."
        ) from e
    layers = builder.trips * builder.period if builder.stack else 0
    return LoweredStep(lowered, builder.specs, builder.shapes, layers, builder.saved_per_layer)


class _StepBuilder:
    """The pieces of one lowering, built in order by `lower`: the plan's torchax environment, the
    abstract state, the block scan, the loss and the AdamW step."""

    def __init__(self, model: torch.nn.Module, mesh: Mesh, devices: np.ndarray, param_spec: Callable[..., Any],
                 config: TrainStepConfig, scan_layers: bool):  # fmt: skip
        import jax.numpy as jnp
        from jax.sharding import Mesh as JaxMesh

        self.model, self.config = model, config
        self.env = import_torchax().tensor.Environment()
        self.jmesh = JaxMesh(devices[mesh.get_logical_mesh()], tuple(mesh.axis_names))
        context = config.sequence_axes[0] if config.sequence_axes else None
        self.attention_calls = (
            route_attention(
                self.env,
                self.jmesh,
                config.batch_axes,
                context,
                kernel_residual_name(config.remat),
                config.splash_blocks,
            )
            if config.attention is Attention.FLASH
            else None
        )
        self.compute = jnp.dtype(config.compute_dtype)  # checked: "bfloat16" or "float32"
        params = dict(model.named_parameters(remove_duplicate=True))
        self.shapes = {n: tuple(p.shape) for n, p in params.items()}
        self.specs = {n: param_spec(n, s) for n, s in self.shapes.items()}
        self.buffers = {n: b for n, b in model.named_buffers() if b.device.type != "meta"}
        self.stack = find_layer_stack(model) if scan_layers else None
        prefix = f"{self.stack[0]}." if self.stack else None
        self.layer_names = [n for n in params if prefix and n.startswith(prefix)]
        self.period = layer_period(self.stack[1]) if self.stack else 1
        self.trips = len(self.stack[1]) // self.period if self.stack else 0
        self.saved_per_layer: tuple[SavedActivation, ...] = ()
        self.head = output_head(model) if config.vocab_tiles > 1 else None
        self.residual_spec = ACTIVATION_AXIS_RULES.spec(RESIDUAL, mesh)

    def sharding(self, spec: PartitionSpec) -> Any:
        from jax.sharding import NamedSharding

        return NamedSharding(self.jmesh, to_jax_spec(spec))

    def gathered(self, t: Any, spec: PartitionSpec) -> Any:
        """FSDP's gather at use: a sharding constraint to ``spec`` without the gather axes."""
        import jax

        value = jax.lax.with_sharding_constraint(
            self.env.t2j_iso(t), self.sharding(_without(spec, self.config.gather_axes))
        )
        return self.env.j2t_iso(value)

    def residual(self, hidden: Any) -> Any:
        """The residual stream between blocks, ``[batch, seq, width]``, laid out by the activation
        rules (`spmd.logical_axes.ACTIVATION_AXIS_RULES`): rows over the batch axes, tokens over
        ``context``, the width over ``tensor`` (MaxText's ``activation_embed``). Constrained only
        where that splits more than the rows, which the partitioner infers from the tokens anyway."""
        import jax

        if hidden.ndim != 3 or len(self.residual_spec) < 2:
            return hidden
        return jax.lax.with_sharding_constraint(hidden, self.sharding(self.residual_spec))

    def block(self, position: int = 0) -> Callable[..., Any]:
        """The stack's block at ``position`` (its kind) as a checkpointed JAX function of (hidden,
        layer params, args, kwargs)."""
        import jax
        from jax.ad_checkpoint import checkpoint_name

        name, layers = self.stack  # type: ignore[misc]
        template, env = layers[position], self.env

        def block(hidden: Any, layer_params: dict[str, Any], args: Any, kwargs: Any) -> Any:
            hidden = self.residual(hidden)
            hidden = checkpoint_name(hidden, BLOCK_INPUT)  # what `offload` moves to the host
            th, tp, targs, tkwargs = env.j2t_iso((hidden, layer_params, args, kwargs))
            with env:
                full = {n: self.gathered(p, self.specs[f"{name}.0.{n}"]) for n, p in tp.items()}
                with reparametrize_module(template, full):
                    out = template(th, *targs, **tkwargs)
            return self.residual(env.t2j_iso(out))

        return jax.checkpoint(block, policy=jax_policy(self.config.remat))

    def scanned(self, stacked: dict[str, Any]) -> Callable[..., Any]:
        """What the layer list's single `_ScannedLayers` runs: every block as one ``lax.scan``."""
        import jax

        block, env = self.block(), self.env

        def run(hidden: Any, *args: Any, **kwargs: Any) -> Any:
            jh, jargs, jkwargs = env.t2j_iso((hidden, args, kwargs))

            def body(carry: Any, layer_params: dict[str, Any]) -> tuple[Any, None]:
                # A block returns its input's dtype in eager torch; some torchax builds promote
                # (an RMSNorm's fp32 upcast leaks out), which a scan carry cannot take.
                return block(carry, layer_params, jargs, jkwargs).astype(carry.dtype), None

            with in_layer_scan():
                out, _ = jax.lax.scan(body, jh, stacked)
            return env.j2t_iso(out)

        return run

    def scanned_by_periods(self, stacked: dict[str, Any]) -> Callable[..., Any]:
        """What the last `PeriodLayer` runs: every whole period of the stack as one ``lax.scan``
        trip, each block with its kind's arguments, then the layers after the last whole period."""
        import jax

        env, p, trips = self.env, self.period, self.trips
        blocks = [self.block(j) for j in range(p)]

        def one(j: int, hidden: Any, params: dict[str, Any], calls: Any) -> Any:
            args, kwargs = calls[j]
            return blocks[j](hidden, params, args, kwargs).astype(hidden.dtype)

        def run(hidden: Any, calls: PeriodCalls) -> Any:
            jh, jcalls = env.t2j_iso((hidden, {j: calls.arguments[j] for j in range(p)}))

            def body(carry: Any, period: dict[str, Any]) -> tuple[Any, None]:
                for j in range(p):
                    carry = one(j, carry, {k: v[j] for k, v in period.items()}, jcalls)
                return carry, None

            periods = {k: v[: trips * p].reshape(trips, p, *v.shape[1:]) for k, v in stacked.items()}
            with in_layer_scan():
                out, _ = jax.lax.scan(body, jh, periods)
            for j in range(len(self.stack[1]) - trips * p):  # type: ignore[index]
                out = one(j, out, {k: v[trips * p + j] for k, v in stacked.items()}, jcalls)
            return env.j2t_iso(out)

        return run

    def loss(self, p: dict[str, Any], stacked: dict[str, Any], tokens: Any) -> Any:
        """The model's token cross-entropy on ``tokens``, its blocks scanned over ``stacked``."""
        import jax

        env, model = self.env, self.model
        p = jax.tree.map(lambda a: a.astype(self.compute), p)
        stacked = jax.tree.map(lambda a: a.astype(self.compute), stacked)
        tp, tbuf, tt = env.j2t_iso((p, {n: env.t2j_copy(b) for n, b in self.buffers.items()}, tokens))
        with env:
            tp = {n: self.gathered(v, self.specs[n]) for n, v in tp.items()}
            restore = self._swap_in_scan(stacked)
            try:
                kwargs = self.context_kwargs() or ({} if self.head else {"labels": tt})
                with hidden_states_only(model, self.head) if self.head else contextlib.nullcontext():
                    out = torch.func.functional_call(
                        model, (tp, tbuf), (tt,), {**kwargs, "use_cache": False}, tie_weights=True, strict=False
                    )
            finally:
                if restore is not None:
                    setattr(*restore)
            if self.head is not None:  # `out` holds the final hidden states: the loss in chunks
                hidden = env.t2j_iso(getattr(out, "logits", out))
                weight = env.t2j_iso(tp[self.head.weight])
                bias = env.t2j_iso(tp[self.head.bias]) if self.head.bias else None
                return tiled_token_loss(hidden, weight, bias, tokens, self.config.vocab_tiles)
            if self.config.sequence_axes:
                return context_token_loss(env.t2j_iso(getattr(out, "logits", out)), tokens)
            loss = out.loss if hasattr(out, "loss") else _token_loss(out, tt)
        return env.t2j_iso(loss)

    def context_kwargs(self) -> dict[str, Any]:
        """With the sequence split over ``context``: each token's true position (the shards hold it
        load-balanced, `spmd.plan.request.context`), and no labels: the loss is the planner's own
        (`context_token_loss`)."""
        if not self.config.sequence_axes:
            return {}
        positions = context_positions(self.jmesh, self.config.seq_len, self.config.sequence_axes, self.model)
        return {"position_ids": self.env.j2t_iso(positions)}

    def _swap_in_scan(self, stacked: dict[str, Any]) -> tuple[Any, str, Any] | None:
        """Put a `_ScannedLayers` in place of the layer list; returns how to put the list back."""
        if self.stack is None:
            return None
        name, layers = self.stack
        owner = self.model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else self.model
        attr = name.rsplit(".", 1)[-1]
        if self.period == 1:
            setattr(owner, attr, torch.nn.ModuleList([_ScannedLayers(layers[0], self.scanned(stacked))]))
        else:
            run, calls = self.scanned_by_periods(stacked), PeriodCalls()
            stand_ins = [PeriodLayer(layer, i, len(layers), self.period, calls, run) for i, layer in enumerate(layers)]
            setattr(owner, attr, torch.nn.ModuleList(stand_ins))
        return (owner, attr, layers)

    def step(self, state: Any, tokens: Any) -> tuple[Any, Any]:
        """Loss, gradients and one AdamW update of the state ``(params, stacked, m, v)``, computed
        in fp32 and stored back in each one's dtype (bf16 weights: MaxText's ``weight_dtype``)."""
        import jax
        import jax.numpy as jnp

        c = self.config
        b1, b2 = c.betas

        def adamw(p: Any, g: Any, m: Any, v: Any) -> tuple[Any, Any, Any]:
            g = g.astype(jnp.float32)
            m_new = b1 * m.astype(jnp.float32) + (1 - b1) * g  # updated in fp32, stored as kept (bf16: MaxText's mu)
            v_new = b2 * v.astype(jnp.float32) + (1 - b2) * jnp.square(g)
            p32 = p.astype(jnp.float32)
            update = m_new / (jnp.sqrt(v_new) + c.eps) + c.weight_decay * p32
            return (p32 - c.learning_rate * update).astype(p.dtype), m_new.astype(m.dtype), v_new.astype(v.dtype)

        params, stacked, m, v = state
        loss, grads = jax.value_and_grad(self.loss, argnums=(0, 1))(params, stacked, tokens)
        weights = (params, stacked)
        updated = jax.tree.map(adamw, weights, grads, m, v)
        new_p, new_m, new_v = jax.tree.transpose(jax.tree.structure(weights), jax.tree.structure((0, 0, 0)), updated)
        return (new_p[0], new_p[1], new_m, new_v), loss

    def abstract_state(self) -> tuple[Any, Any]:
        """``(state, tokens)`` as sharded ``ShapeDtypeStruct`` values: flat parameters, the layer
        stack's parameters stacked on a leading dim, AdamW's moments like them, the int32 batch."""
        import jax
        import jax.numpy as jnp

        weight = jnp.dtype(self.config.weight_dtype)
        flat = {
            n: jax.ShapeDtypeStruct(s, weight, sharding=self.sharding(self.specs[n]))
            for n, s in self.shapes.items()
            if n not in self.layer_names
        }
        stacked: dict[str, Any] = {}
        if self.stack is not None:
            name, layers = self.stack
            for local, _ in layers[0].named_parameters():
                shape, spec = self.shapes[f"{name}.0.{local}"], self.specs[f"{name}.0.{local}"]
                stacked_spec = P(None, *spec.padded(len(shape)))
                stacked[local] = jax.ShapeDtypeStruct(
                    (len(layers), *shape), weight, sharding=self.sharding(stacked_spec)
                )
        c = self.config
        tokens = jax.ShapeDtypeStruct(
            (c.global_batch, c.seq_len), jnp.int32,
            sharding=self.sharding(P(c.batch_axes or None, c.sequence_axes or None)),
        )  # fmt: skip
        mu = jnp.dtype(c.moment_dtype)
        first = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, mu, sharding=a.sharding), (flat, stacked))
        return (flat, stacked, first, (flat, stacked)), tokens

    def lower(self) -> Any:
        import jax

        state, tokens = self.abstract_state()
        row_major = row_major_names(self.config.remat)  # out_proj and mlpwo offloaded: see `residuals`
        with contextlib.ExitStack() as named:
            if self.config.fused:  # before the names: each member's slice is named as its own output
                named.enter_context(fused_projections(fusion_groups(self.model, self.config.fused), self.env))
            for template in self.stack[1][: self.period] if self.stack else ():  # one block of each kind
                named.enter_context(named_projections(template, self.env, row_major))
            named.enter_context(causal_without_mask(self.model, self.attention_calls is None))
            named.enter_context(mosaic_ir_for_libtpu())
            traced = jax.jit(self.step, donate_argnums=(0,)).trace(state, tokens)
            lowered = traced.lower()
        if self.stack is not None:
            self.saved_per_layer = saved_residuals(traced.jaxpr.jaxpr)
        if self.attention_calls is not None and not self.attention_calls:
            if getattr(getattr(self.model, "config", None), "attn_logit_softcapping", None):
                raise TracingError(
                    f"--attention flash: {type(self.model).__name__} soft-caps its attention scores "
                    "(attn_logit_softcapping, Gemma 2), which splash attention does not, so Hugging Face keeps it on "
                    "eager attention. Plan it with --attention dot (its sliding windows are kept)."
                )
            raise TracingError(
                f"--attention flash: {type(self.model).__name__} never called scaled_dot_product_attention (it "
                "computes attention itself, e.g. Hugging Face's attn_implementation='eager'), so no kernel could "
                "replace it. Build the model with attn_implementation='sdpa', or plan with --attention dot."
            )
        return lowered


def _token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``[batch, seq, vocab]`` logits."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1)
    )
