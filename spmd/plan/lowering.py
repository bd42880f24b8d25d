"""The training step of a meta-device torch model as a JAX function over abstract sharded arrays.

Nothing here allocates a parameter: the model is built on the ``meta`` device, its parameters
become ``jax.ShapeDtypeStruct`` values carrying a ``NamedSharding``, and ``torchax`` runs the
module's own ``forward`` on JAX tracers. Only buffers (rotary tables, masks) are real.

The step is what `fsdp_xla.FSDP` runs: forward, token cross-entropy, backward, AdamW with fp32
master weights and moments stored like the parameters. FSDP units are the repeated blocks of the
model; each gathers its parameters at use (a sharding constraint to the spec without the
``fsdp`` axis), so XLA keeps one unit gathered at a time, as our GSPMD wrapper does.

The repeated blocks run as one ``lax.scan`` over parameters stacked on a leading layer dim
(MaxText's ``scan_layers``, torch_xla's ``scan_layers``): the TPU compiler then compiles one
block instead of L, which is what makes a 32-layer model plan in minutes (an unrolled 12-layer
GPT-2 took 167 s on this machine). Per-device bytes are those of the unrolled program: a
stacked array is sharded on the same dims as each of its layers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mesh import Mesh
from spmd.partition_spec import P, PartitionSpec

__all__ = ["LoweredStep", "TrainStepConfig", "find_layer_stack", "lower_train_step", "to_jax_spec"]


@dataclass(frozen=True)
class TrainStepConfig:
    """What the compiled step does.

    Attributes:
        global_batch: sequences per step over all devices.
        seq_len: tokens per sequence.
        compute_dtype: ``"bfloat16"`` (parameters cast at use, fp32 masters) or ``"float32"``.
        gradient_checkpointing: recompute each block's activations in backward.
        batch_axes: mesh axes the batch dim is split over.
        learning_rate, weight_decay, betas, eps: AdamW's.
    """

    global_batch: int
    seq_len: int
    compute_dtype: str = "bfloat16"
    gradient_checkpointing: bool = False
    batch_axes: tuple[str, ...] = ("fsdp",)
    gather_axes: tuple[str, ...] = ("fsdp",)
    learning_rate: float = 1e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8


@dataclass(frozen=True)
class LoweredStep:
    """A lowered step and what went into it.

    Attributes:
        lowered: ``jax.stages.Lowered``; ``.compile()`` runs the target's compiler.
        param_specs: stored spec of every parameter, by its torch name (layer params one by one).
        param_shapes: global shape of every parameter.
        scanned_layers: how many blocks run as one scan (0: unrolled).
    """

    lowered: Any
    param_specs: Mapping[str, PartitionSpec]
    param_shapes: Mapping[str, tuple[int, ...]]
    scanned_layers: int


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
        config: batch, sequence, precision and optimizer (`TrainStepConfig`).
        scan_layers: run the repeated blocks as one scan (see the module docstring).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh as JaxMesh
    from jax.sharding import NamedSharding
    from torch.nn.utils import stateless

    env = _import_torchax().default_env()
    jmesh = JaxMesh(np.asarray(jax_devices)[mesh.get_logical_mesh()], tuple(mesh.axis_names))
    compute = jnp.bfloat16 if config.compute_dtype == "bfloat16" else jnp.float32

    def sharding(spec: PartitionSpec) -> Any:
        return NamedSharding(jmesh, to_jax_spec(spec))

    params = dict(model.named_parameters(remove_duplicate=True))
    shapes = {n: tuple(p.shape) for n, p in params.items()}
    specs = {n: param_spec(n, s) for n, s in shapes.items()}
    buffers = {n: b for n, b in model.named_buffers() if b.device.type != "meta"}
    stack = find_layer_stack(model) if scan_layers else None

    layer_names: list[str] = []
    stacked_specs: dict[str, PartitionSpec] = {}
    if stack is not None:
        stack_name, layers = stack
        template = layers[0]
        local = [n for n, _ in template.named_parameters()]
        prefix = f"{stack_name}."
        layer_names = [n for n in params if n.startswith(prefix)]
        for n in local:
            stacked_specs[n] = P(None, *specs[f"{prefix}0.{n}"].padded(len(shapes[f"{prefix}0.{n}"])))

    def gathered(t: Any, spec: PartitionSpec) -> Any:
        value = jax.lax.with_sharding_constraint(env.t2j_iso(t), sharding(_without(spec, config.gather_axes)))
        return env.j2t_iso(value)

    def run_block_scan(stacked: dict[str, Any]) -> Callable[..., Any]:
        name, layers = stack  # type: ignore[misc]
        template = layers[0]

        def block(hidden: Any, layer_params: dict[str, Any], args: Any, kwargs: Any) -> Any:
            th, tp, targs, tkwargs = env.j2t_iso((hidden, layer_params, args, kwargs))
            with env:
                full = {n: gathered(p, specs[f"{name}.0.{n}"]) for n, p in tp.items()}
                with stateless._reparametrize_module(template, full):
                    out = template(th, *targs, **tkwargs)
            return env.t2j_iso(out)

        # FSDP keeps no gathered weight for backward: it gathers again, as our barriers make
        # GSPMD do. Naming the gathered value is not enough, since whatever torch derives from it
        # (a Linear's transposed weight) would be kept instead; so without checkpointing the
        # block keeps its matmul outputs (activations, never weights) and recomputes the rest,
        # gathers included. Gradient checkpointing keeps nothing and recomputes the block.
        policy = (
            jax.checkpoint_policies.nothing_saveable
            if config.gradient_checkpointing
            else jax.checkpoint_policies.dots_saveable
        )
        block = jax.checkpoint(block, policy=policy)

        def run(hidden: Any, *args: Any, **kwargs: Any) -> Any:
            jh, jargs, jkwargs = env.t2j_iso((hidden, args, kwargs))

            def body(carry: Any, layer_params: dict[str, Any]) -> tuple[Any, None]:
                # A block returns its input's dtype in eager torch; some torchax builds promote
                # (an RMSNorm's fp32 upcast leaks out), which a scan carry cannot take.
                return block(carry, layer_params, jargs, jkwargs).astype(carry.dtype), None

            out, _ = jax.lax.scan(body, jh, stacked)
            return env.j2t_iso(out)

        return run

    def loss_fn(p: dict[str, Any], stacked: dict[str, Any], tokens: Any) -> Any:
        p = jax.tree.map(lambda a: a.astype(compute), p)
        stacked = jax.tree.map(lambda a: a.astype(compute), stacked)
        tp, tbuf, tt = env.j2t_iso((p, {n: env.t2j_copy(b) for n, b in buffers.items()}, tokens))
        with env:
            tp = {n: gathered(v, specs[n]) for n, v in tp.items()}
            restore = None
            if stack is not None:
                name, layers = stack
                owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
                attr = name.rsplit(".", 1)[-1]
                restore = (owner, attr, layers)
                setattr(owner, attr, torch.nn.ModuleList([_ScannedLayers(layers[0], run_block_scan(stacked))]))
            try:
                out = torch.func.functional_call(
                    model, (tp, tbuf), (tt,), {"labels": tt, "use_cache": False}, tie_weights=True, strict=False
                )
            finally:
                if restore is not None:
                    setattr(restore[0], restore[1], restore[2])
            loss = out.loss if hasattr(out, "loss") else _token_loss(out, tt)
        return env.t2j_iso(loss)

    b1, b2 = config.betas

    def adamw(p: Any, g: Any, m: Any, v: Any) -> tuple[Any, Any, Any]:
        g = g.astype(jnp.float32)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * jnp.square(g)
        p = p - config.learning_rate * (m / (jnp.sqrt(v) + config.eps) + config.weight_decay * p)
        return p, m, v

    def step(state: Any, tokens: Any) -> tuple[Any, Any]:
        params_, stacked_, m, v = state
        loss, (g, gs) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params_, stacked_, tokens)
        weights = (params_, stacked_)
        updated = jax.tree.map(adamw, weights, (g, gs), m, v)
        new_p, new_m, new_v = jax.tree.transpose(jax.tree.structure(weights), jax.tree.structure((0, 0, 0)), updated)
        return (new_p[0], new_p[1], new_m, new_v), loss

    flat = {
        n: jax.ShapeDtypeStruct(shapes[n], jnp.float32, sharding=sharding(specs[n]))
        for n in params
        if n not in layer_names
    }
    stacked_abs: dict[str, Any] = {}
    if stack is not None:
        count = len(stack[1])
        for n, spec in stacked_specs.items():
            shape = (count, *shapes[f"{stack[0]}.0.{n}"])
            stacked_abs[n] = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding(spec))
    state = (flat, stacked_abs, (flat, stacked_abs), (flat, stacked_abs))
    tokens = jax.ShapeDtypeStruct(
        (config.global_batch, config.seq_len), jnp.int32, sharding=sharding(P(config.batch_axes or None, None))
    )
    lowered = jax.jit(step, donate_argnums=(0,)).lower(state, tokens)
    return LoweredStep(lowered, specs, shapes, len(stack[1]) if stack is not None else 0)


def _import_torchax() -> Any:
    """``torchax``, which the PyPI wheel of 0.0.13 cannot import without flax: its
    ``checkpoint`` module imports ``flax.training.checkpoints`` at the top, for save/load
    helpers the planner never calls. When flax is absent, a placeholder stands in while torchax
    imports and is removed right after, so nothing else sees a fake flax."""
    import importlib.util
    import sys
    import types

    if "torchax" in sys.modules or importlib.util.find_spec("flax") is not None:
        import torchax

        return torchax
    names = ("flax", "flax.training", "flax.training.checkpoints")
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["flax"].training = sys.modules["flax.training"]  # type: ignore[attr-defined]
    sys.modules["flax.training"].checkpoints = sys.modules["flax.training.checkpoints"]  # type: ignore[attr-defined]
    try:
        import torchax
    finally:
        for name in names:
            sys.modules.pop(name, None)
    return torchax


def _token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of ``[batch, seq, vocab]`` logits."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1)
    )
