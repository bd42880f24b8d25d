"""`plan`: compile one training step of a model for a TPU topology on this machine, and report.

The pieces: `spmd.plan.models` builds the model on ``meta``; `spmd.plan.topology` names the
slice; a `Mesh` over the topology's devices in JAX's ICI-aware order (`create_device_mesh`, or
`create_hybrid_device_mesh` across slices, the order our `HybridMesh` follows); the strategy's
specs (`fsdp_xla`'s FSDP rule, the Hugging Face 2-D plans, or replication);
`spmd.plan.lowering` lowers the step; libtpu's compiler compiles it; `spmd.plan.program` and
`spmd.plan.report` read the result.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mesh import Mesh
from spmd.errors import ShardingError
from spmd.named_sharding import resolve_spec
from spmd.partition_spec import P, PartitionSpec
from spmd.plan.lowering import TrainStepConfig, lower_train_step
from spmd.plan.models import build_meta_model
from spmd.plan.program import step_collectives
from spmd.plan.report import MemoryReport, PlanReport, StepEstimate, summarize
from spmd.plan.topology import DCN_BYTES_PER_SECOND_PER_CHIP, TpuSlice, parse_slice

__all__ = [
    "DEFAULT_SEQ_LEN",
    "STRATEGIES",
    "PlanError",
    "auto_mesh_shape",
    "check_even_splits",
    "default_seq_len",
    "param_spec_for",
    "plan",
    "resolve_seq_len",
    "tpu_devices",
    "uneven_splits",
]

STRATEGIES = ("fsdp", "2d", "dp")


class PlanError(ShardingError):
    """A plan request that cannot be compiled as given (mesh, strategy, batch)."""


def tpu_devices(target: TpuSlice) -> list[Any]:
    """The target's devices from libtpu's compiler (no TPU needed).

    libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) when it loads, which would make a
    second planner (a test, an advisor worker) fail while one runs; the planner never touches a
    TPU, so it lets several load (``ALLOW_MULTIPLE_LIBTPU_LOAD``, unless set otherwise).
    """
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    kwargs = {"num_slices": target.slices} if target.slices > 1 else {}
    return list(topologies.get_topology_desc(platform="tpu", topology_name=target.libtpu_topology, **kwargs).devices)


def auto_mesh_shape(strategy: str, target: TpuSlice, tensor: int = 4) -> dict[str, int]:
    """The default mesh: ``data`` over slices (DCN) when there are several, then ``fsdp`` over
    each slice's chips; 2-D splits ``tensor`` (default 4, as PyTorch/XLA's Llama 2 70B runs) off
    ``fsdp``; data parallel is one ``data`` axis over every chip."""
    per_slice = target.chips_per_slice
    data = {"data": target.slices} if target.slices > 1 else {}
    if strategy == "dp":
        return {"data": target.chips}
    if strategy == "2d":
        if per_slice % tensor:
            raise PlanError(f"tensor={tensor} does not divide the {per_slice} chips of a {target.name} slice.")
        return {**data, "fsdp": per_slice // tensor, "tensor": tensor}
    return {**data, "fsdp": per_slice}


def build_mesh(shape: Mapping[str, int], target: TpuSlice, devices: list[Any]) -> Mesh:
    """Our `Mesh` over ``devices`` positions, in JAX's physical order (a ``data`` axis spans slices)."""
    from jax.experimental import mesh_utils

    names, sizes = tuple(shape), tuple(shape.values())
    if math.prod(sizes) != len(devices):
        raise PlanError(
            f"Mesh {dict(shape)} has {math.prod(sizes)} devices; {target.name} x {target.slices} slice(s) has "
            f"{len(devices)}. Make the axis sizes multiply to {len(devices)}."
        )
    if target.slices > 1:
        dcn = tuple(target.slices if n == "data" else 1 for n in names)
        if "data" not in names or shape["data"] % target.slices:
            raise PlanError(f"With {target.slices} slices the mesh needs a 'data' axis divisible by {target.slices}.")
        ici = tuple(s // d for s, d in zip(sizes, dcn))
        ordered = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, allow_split_physical_axes=True)
    else:
        ordered = mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
    position = {d.id: k for k, d in enumerate(devices)}
    ids = np.vectorize(lambda d: position[d.id])(ordered)
    return Mesh(ids.reshape(-1), sizes, names)


def param_spec_for(strategy: str, mesh: Mesh, hf_config: Any) -> Callable[[str, tuple[int, ...]], PartitionSpec]:
    """``(name, shape) -> stored spec`` of ``strategy``: FSDP is `fsdp_xla`'s rule (the FSDP axis
    on the largest dim it divides); 2-D is the Hugging Face GPT-2 / Llama plan of
    `fsdp_xla.hf.plans`; data parallel replicates."""
    from fsdp_xla._sharding import default_fsdp_spec

    if strategy == "dp":
        return lambda name, shape: P()
    if strategy == "fsdp":
        size = mesh.axis_size("fsdp")
        return lambda name, shape: default_fsdp_spec(shape, "fsdp", size)
    if strategy == "2d":
        from fsdp_xla.hf.plans import gpt2_plan, llama_plan

        model_type = getattr(hf_config, "model_type", None)
        plans = {"gpt2": gpt2_plan, "llama": llama_plan, "mistral": llama_plan, "qwen2": llama_plan}
        if model_type not in plans:
            raise PlanError(
                f"No 2-D plan for model_type {model_type!r}; known: {sorted(plans)}. Use strategy 'fsdp', or pass "
                "param_spec= a function (name, shape) -> PartitionSpec."
            )
        sharding_plan = plans[model_type]()
        return lambda name, shape: sharding_plan.spec_for(name, shape, mesh)
    raise PlanError(f"Unknown strategy {strategy!r}; known: {STRATEGIES}.")


_AXES = ("data", "fsdp", "tensor")


def _check_mesh_axes(shape: Mapping[str, int], strategy: str) -> None:
    unknown = [a for a in shape if a not in _AXES]
    if unknown:
        raise PlanError(
            f"Mesh {dict(shape)} has axes {unknown}; the planner's axes are {_AXES} (data: batch only, fsdp: batch "
            "and parameters, tensor: the 2-D plan's heads/mlp/vocab). Rename the axes."
        )
    needs = {"fsdp": ("fsdp",), "2d": ("fsdp", "tensor"), "dp": ()}[strategy]
    missing = [a for a in needs if a not in shape]
    if missing or any(not isinstance(v, int) or v < 1 for v in shape.values()):
        raise PlanError(
            f"Strategy {strategy!r} needs mesh axes {needs} with positive integer sizes; got mesh {dict(shape)}."
        )


def _split_counts(shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh) -> list[int]:
    """How many ways ``spec`` splits each dim of ``shape`` on ``mesh``."""
    return [math.prod(mesh.mesh_shape[a] for a in axes) for axes in resolve_spec(mesh, spec, len(shape), shape)]


def uneven_splits(
    shapes: Mapping[str, tuple[int, ...]], spec_fn: Callable[[str, tuple[int, ...]], PartitionSpec], mesh: Mesh
) -> list[str]:
    """Parameters whose spec splits a dim into unequal blocks, as ``name (shape): dim d (n) over
    k``. JAX compiles only even splits of a program's arguments; torch_xla would pad the last block."""
    out = []
    for name, shape in shapes.items():
        spec = spec_fn(name, shape)
        for dim, (entry, parts) in enumerate(zip(spec.padded(len(shape)), _split_counts(shape, spec, mesh))):
            if shape[dim] % parts:
                axes = (entry,) if isinstance(entry, str) else entry
                out.append(f"{name} {shape}: dim {dim} ({shape[dim]}) over {'x'.join(axes)}={parts}")
    return out


def check_even_splits(
    strategy: str,
    shapes: Mapping[str, tuple[int, ...]],
    spec_fn: Callable[[str, tuple[int, ...]], PartitionSpec],
    mesh: Mesh,
) -> None:
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


def _block_bytes(shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh, itemsize: int) -> int:
    """Bytes of the largest block one device holds (each split dim rounded up)."""
    total = itemsize
    for dim, parts in zip(shape, _split_counts(shape, spec, mesh)):
        total *= -(-dim // parts)
    return total


def _position_table(hf_config: Any) -> int | None:
    """A learned position table's length (GPT-2's ``n_positions``); rotary models (Llama) have none."""
    limit = getattr(hf_config, "n_positions", None)
    return limit if isinstance(limit, int) else None


def default_seq_len(hf_config: Any) -> int:
    """2048 tokens, or the model's learned position table if that is shorter (GPT-2: 1024)."""
    limit = _position_table(hf_config)
    return DEFAULT_SEQ_LEN if limit is None else min(DEFAULT_SEQ_LEN, limit)


def resolve_seq_len(seq_len: int | None, hf_config: Any) -> int:
    """``seq_len``, or `default_seq_len` for ``None``.

    Raises:
        PlanError: longer than a learned position table, which the torch model could not run.
    """
    if seq_len is None:
        return default_seq_len(hf_config)
    limit = _position_table(hf_config)
    if limit is not None and seq_len > limit:
        raise PlanError(
            f"seq_len={seq_len} is longer than the model's learned position table (n_positions={limit}): the model "
            f"cannot run it. Give --seq {limit} or less (seq_len={limit}), or a config with a larger n_positions."
        )
    return seq_len


DEFAULT_SEQ_LEN = 2048


def plan(
    model: str | Path | torch.nn.Module,
    topology: str,
    *,
    strategy: str = "fsdp",
    mesh: Mapping[str, int] | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    compute_dtype: str = "bfloat16",
    gradient_checkpointing: bool = False,
    slices: int = 1,
    tensor: int = 4,
    param_spec: Callable[[str, tuple[int, ...]], PartitionSpec] | None = None,
    hbm_bytes: int | None = None,
) -> PlanReport:
    """Compile one AdamW training step of ``model`` for ``topology`` with libtpu's compiler, on
    this machine, and report per-chip memory, collectives, FLOPs and an estimated MFU.

    Args:
        model: a built-in name (``llama2-7b``), a Hugging Face ``config.json``, a
            ``module:function`` factory, or a module on ``meta`` (`spmd.plan.models`).
        topology: a TPU slice, ``v5p-128`` or ``v5p:4x4x4`` (`spmd.plan.topology`).
        strategy: ``fsdp``, ``2d`` (fsdp x tensor) or ``dp``.
        mesh: axis sizes, e.g. ``{"fsdp": 32, "tensor": 4}``; default `auto_mesh_shape`.
        global_batch: sequences per step; default one per chip.
        seq_len: tokens per sequence; default `default_seq_len` (2048, or a shorter learned
            position table: 1024 for GPT-2).
        compute_dtype: ``bfloat16`` (fp32 master weights and AdamW state) or ``float32``.
        gradient_checkpointing: recompute each layer in backward.
        slices: slices joined over DCN (a ``data`` axis spans them).
        tensor: the tensor axis size of the default 2-D mesh.
        param_spec: overrides the strategy's ``(name, shape) -> spec``.
        hbm_bytes: the per-chip memory budget the verdict uses; default the chip's HBM.

    Raises:
        PlanError, TopologyError, ModelSpecError: bad input, with what to change.
    """
    if strategy not in STRATEGIES:
        raise PlanError(f"Unknown strategy {strategy!r}; known: {STRATEGIES}.")
    if compute_dtype not in ("bfloat16", "float32"):
        raise PlanError(f"compute_dtype must be 'bfloat16' or 'float32', got {compute_dtype!r}.")
    target = parse_slice(topology, slices)
    shape = dict(mesh) if mesh is not None else auto_mesh_shape(strategy, target, tensor)
    _check_mesh_axes(shape, strategy)
    if math.prod(shape.values()) != target.chips:
        raise PlanError(
            f"Mesh {shape} has {math.prod(shape.values())} devices; {target.name} x {target.slices} slice(s) has "
            f"{target.chips} chips. Make the axis sizes multiply to {target.chips}."
        )
    batch_axes = tuple(a for a in shape if a != "tensor")
    batch = global_batch if global_batch is not None else target.chips // (shape.get("tensor", 1))
    batch_parts = math.prod(shape[a] for a in batch_axes)
    if batch < 1 or batch % batch_parts:
        raise PlanError(
            f"global_batch={batch} does not split over the batch axes {batch_axes} ({batch_parts} parts) of mesh "
            f"{shape}; give a multiple of {batch_parts}."
        )
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len < 2):
        raise PlanError(f"seq_len must be an int >= 2 (tokens per sequence), got {seq_len!r}.")
    module, hf_config = build_meta_model(model)
    seq_len = resolve_seq_len(seq_len, hf_config)
    devices = tpu_devices(target)
    our_mesh = build_mesh(shape, target, devices)
    spec_fn = param_spec or param_spec_for(strategy, our_mesh, hf_config)
    check_even_splits(strategy, {n: tuple(p.shape) for n, p in module.named_parameters()}, spec_fn, our_mesh)
    config = TrainStepConfig(
        global_batch=batch,
        seq_len=seq_len,
        compute_dtype=compute_dtype,
        gradient_checkpointing=gradient_checkpointing,
        batch_axes=batch_axes,
        gather_axes=("fsdp",) if "fsdp" in shape else (),
    )
    lowered = lower_train_step(module, our_mesh, np.asarray(devices), spec_fn, config)
    predicted = 3 * sum(_block_bytes(s, lowered.param_specs[n], our_mesh, 4) for n, s in lowered.param_shapes.items())
    predicted += _block_bytes((batch, seq_len), P(batch_axes or None), our_mesh, 4)
    budget = target.chip.hbm_bytes if hbm_bytes is None else hbm_bytes
    start = time.perf_counter()
    try:
        compiled = lowered.lowered.compile()
    except Exception as e:  # jaxlib's XlaRuntimeError; only the compiler's own OOM is a result
        if "RESOURCE_EXHAUSTED" not in str(e) or _oom_used_bytes(str(e)) is None:
            raise
        compiled = None
        oom_message = str(e)
    compile_seconds = time.perf_counter() - start

    if compiled is None:
        memory = MemoryReport(0, 0, 0, 0, 0, predicted, budget, _oom_used_bytes(oom_message), _largest(oom_message))
        collectives, cost = [], {}
    else:
        stats = compiled.memory_analysis()
        memory = MemoryReport(
            argument_bytes=stats.argument_size_in_bytes,
            output_bytes=stats.output_size_in_bytes,
            alias_bytes=stats.alias_size_in_bytes,
            temp_bytes=stats.temp_size_in_bytes,
            generated_code_bytes=stats.generated_code_size_in_bytes,
            predicted_argument_bytes=predicted,
            hbm_bytes=budget,
            compiler_accepted=budget >= target.chip.hbm_bytes,  # libtpu compiled it for this chip's HBM
        )
        collectives = step_collectives(compiled.as_text())
        cost = compiled.cost_analysis() or {}
        if isinstance(cost, list):
            cost = cost[0] if cost else {}
    summary = summarize(collectives)
    n_params = sum(math.prod(s) for s in lowered.param_shapes.values())
    estimate = _estimate(target, hf_config, n_params, batch, seq_len, gradient_checkpointing, collectives)
    return PlanReport(
        model=str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__,
        topology=target.name,
        chip=target.chip.name,
        chips=target.chips,
        slices=target.slices,
        mesh=shape,
        strategy=strategy,
        global_batch=batch,
        seq_len=seq_len,
        compute_dtype=compute_dtype,
        gradient_checkpointing=gradient_checkpointing,
        n_params=n_params,
        scanned_layers=lowered.scanned_layers,
        memory=memory,
        collectives=summary,
        xla_flops=float(cost.get("flops", 0.0)),
        xla_bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        estimate=estimate,
        compile_seconds=compile_seconds,
        param_specs={n: str(s) for n, s in lowered.param_specs.items()},
    )


_UNITS = {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _oom_used_bytes(message: str) -> int | None:
    """The usage in libtpu's "Ran out of memory in memory space hbm. Used 45.97G of 15.75G hbm"."""
    found = re.search(r"Used ([\d.]+)([BKMGT]) of ([\d.]+)([BKMGT]) hbm", message)
    return None if found is None else int(float(found[1]) * _UNITS[found[2]])


def _largest(message: str, top: int = 5) -> tuple[str, ...]:
    """The compiler's largest buffers, one line each: size, shape, operation."""
    found = re.findall(r"Size: ([\d.]+\w)\s+Operator: op_name=\"([^\"]*)\"\s+Shape: (\S+)", message)
    return tuple(f"{size:>8s}  {shape}  ({op})" for size, op, shape in found[:top])


def _estimate(
    target: TpuSlice,
    hf_config: Any,
    n_params: int,
    batch: int,
    seq_len: int,
    checkpointing: bool,
    collectives: list[Any],
) -> StepEstimate:
    from spmd.mfu.flops import TransformerShape, matmul_flops_per_token, six_n_flops_per_token

    try:
        per_token = matmul_flops_per_token(TransformerShape.from_hf_config(hf_config, n_params), seq_len)
    except (ValueError, AttributeError):
        per_token = six_n_flops_per_token(n_params)
    model_flops = per_token * batch * seq_len
    chip = target.chip
    compute = model_flops / target.chips / chip.peak_flops * (4 / 3 if checkpointing else 1.0)
    ici = sum(c.bytes_sent_per_device for c in collectives if not c.over_dcn) / chip.allreduce_bytes_per_second
    dcn = sum(c.bytes_sent_per_device for c in collectives if c.over_dcn) / DCN_BYTES_PER_SECOND_PER_CHIP
    overlapped = max(compute, ici + dcn)
    serial = compute + ici + dcn
    mfu = lambda t: model_flops / (t * target.chips * chip.peak_flops) if t > 0 else 0.0  # noqa: E731
    return StepEstimate(model_flops, compute, ici, dcn, overlapped, serial, mfu(overlapped), mfu(serial))
