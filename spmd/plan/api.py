"""`plan`: compile one training step of a model for a TPU topology on this machine, and report.

It reads as its steps, in order: check the request (`_request`); build the model on ``meta``
(`spmd.plan.request.models`); get the topology's devices from libtpu and lay out the mesh
(`spmd.plan.request.meshes`); the strategy's parameter specs, checked for even splits
(`spmd.plan.request.specs`); lower the step (`spmd.plan.lower.lowering`); compile it (`spmd.plan.compile.step`);
read its collectives (`spmd.plan.compile.program`), predict its time from the compiled program
(`spmd.plan.predict.predict_step`) with the roofline bound beside it (`spmd.plan.predict.estimate`) and report
(`spmd.plan.report.plan_report`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mesh import Mesh, Role, roles
from mesh.checks import is_int
from spmd.plan._jax_compat import toolchain
from spmd.plan.compile.program import splash_kernels, step_collectives
from spmd.plan.compile.step import CompiledStep, compile_step
from spmd.plan.errors import PlanError
from spmd.plan.lower.lowering import LoweredStep, TrainStepConfig, lower_train_step
from spmd.plan.predict import predict_step
from spmd.plan.predict.estimate import estimate_step
from spmd.plan.predict.memory import model_shape
from spmd.plan.report.plan_report import ContextReport, MemoryReport, PlanReport, summarize
from spmd.plan.request.attention import Attention
from spmd.plan.request.context import (
    axes_spanned,
    check_context,
    check_no_sliding_window,
    check_takes_positions,
    kv_gather_bytes,
)
from spmd.plan.request.dcn import split_dcn
from spmd.plan.request.meshes import STRATEGIES, auto_mesh_shape, batch_axes, build_mesh, check_mesh, tpu_devices
from spmd.plan.request.models import DEFAULT_SEQ_LEN, build_meta_model, default_seq_len, resolve_seq_len
from spmd.plan.request.remat import Remat
from spmd.plan.request.settings import PlanSettings
from spmd.plan.request.specs import SpecFn, argument_bytes, check_even_splits, param_spec_for, uneven_splits
from spmd.plan.request.splash_blocks import SplashBlocks, check_no_context_axis
from spmd.plan.request.topology import TpuSlice
from spmd.sharding import PartitionSpec

__all__ = [
    "DEFAULT_SEQ_LEN",
    "STRATEGIES",
    "PlanError",
    "auto_mesh_shape",
    "check_even_splits",
    "default_seq_len",
    "param_spec_for",
    "plan",
    "plan_program",
    "plan_with",
    "resolve_seq_len",
    "tpu_devices",
    "uneven_splits",
]


@dataclass(frozen=True)
class _Request:
    """A checked plan request: the shared settings (`PlanSettings`) and the one plan's choices."""

    settings: PlanSettings
    strategy: str
    mesh: dict[str, int]
    global_batch: int
    remat: Remat
    dcn: dict[str, int] = field(default_factory=dict)

    @property
    def target(self) -> TpuSlice:
        return self.settings.target


def _request(
    settings: PlanSettings, strategy: str, mesh: Mapping[str, int] | None, global_batch: int | None,
    remat: str | Remat, tensor: int,
) -> _Request:  # fmt: skip
    """Check the one plan's choices (the settings checked themselves); raise with what to change."""
    if strategy not in STRATEGIES:
        raise PlanError(f"Unknown strategy {strategy!r}; known: {STRATEGIES}.")
    policy = Remat.parse(remat)
    if mesh is not None and not isinstance(mesh, Mapping):
        raise PlanError(f"mesh must map axis names to sizes, e.g. {{'fsdp': 32, 'tensor': 4}}, got {mesh!r:.80}.")
    if not is_int(tensor) or not 1 <= tensor <= 4096:
        raise PlanError(f"tensor must be a whole number from 1 to 4096 (the tensor axis size), got {tensor!r:.60}.")
    target = settings.target
    if mesh is not None:
        shape, dcn = split_dcn(mesh, target.slices)
    else:
        shape = auto_mesh_shape(strategy, target, tensor)  # a data axis over the slices
        dcn = {Role.DATA.value: target.slices} if target.slices > 1 else {}
    check_mesh(shape, strategy, target)
    if (
        roles.sequence_axes(tuple(shape))
        and shape[Role.CONTEXT.value] > 1
        and settings.attention is not Attention.FLASH
    ):
        raise PlanError(
            f"Mesh {shape} splits the sequence over context={shape[Role.CONTEXT.value]}, which the planner plans with "
            "splash attention only (its load-balanced causal mask; dot attention would materialize the whole "
            "seq x seq scores of every shard's queries). Add --attention flash, or drop the context axis."
        )
    axes = batch_axes(shape)
    parts = math.prod(shape[a] for a in axes)
    batch = global_batch if global_batch is not None else parts
    if not is_int(batch) or not 1 <= batch <= 2**31:
        raise PlanError(f"global_batch must be a whole number of sequences from 1 to 2**31, got {batch!r:.60}.")
    if batch % parts:
        raise PlanError(
            f"global_batch={batch!r} does not split over the batch axes {axes} ({parts} parts) of mesh {shape}; "
            f"give a multiple of {parts}."
        )
    return _Request(settings, strategy, shape, batch, policy, dcn)


def plan(
    model: str | Path | torch.nn.Module,
    topology: str,
    *,
    strategy: str = Role.FSDP.value,
    mesh: Mapping[str, int] | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    compute_dtype: str = "bfloat16",
    remat: str | Remat = "dots",
    attention: str | Attention = "dot",
    slices: int = 1,
    tensor: int = 4,
    param_spec: Callable[[str, tuple[int, ...]], PartitionSpec] | None = None,
    hbm_bytes: int | None = None,
    moment_dtype: str = "float32",
    vocab_tiles: int = 1,
    splash_blocks: str | SplashBlocks | None = None,
    scoped_vmem_kib: int | None = None,
    weight_dtype: str = "float32",
    fused: str | tuple[str, ...] = (),
) -> PlanReport:
    """Compile one AdamW training step of ``model`` for ``topology`` with libtpu's compiler, on
    this machine, and report per-device memory, collectives, FLOPs and an estimated MFU.

    Args:
        model: a built-in name (``llama3.1-70b``), a Hugging Face ``config.json``, a
            ``module:function`` factory, or a module on ``meta`` (`spmd.plan.request.models`).
        topology: a TPU slice: ``v5p-128``, ``tpu7x-128`` or a chip grid ``tpu7x:4x4x4`` (`spmd.plan.request.topology`).
        strategy: ``fsdp``, ``2d`` (fsdp x tensor), ``dp``, or ``cp`` (fsdp x context: the sequence split
            over ``context``, `spmd.plan.request.context`; ``fsdp`` on a mesh with a context axis is the same plan).
        mesh: axis sizes over the devices, e.g. ``{"fsdp": 32, "tensor": 4}`` or ``{"fsdp": 64, "context": 8}``;
            default `auto_mesh_shape`. Across slices, ``dcn_<axis>`` entries say how many slices an
            axis spans, MaxText's way (``{"dcn_fsdp": 2, "fsdp": 64, "tensor": 4}``: `spmd.plan.request.dcn`).
        global_batch: sequences per step; default one per batch shard.
        seq_len: tokens per sequence; default `default_seq_len` (2048, or a shorter position table: GPT-2's 1024).
        compute_dtype: ``bfloat16`` (bf16 compute; master weights as ``weight_dtype``) or ``float32``.
        remat: what each block keeps for backward, by MaxText's names: ``none``, ``dots``
            (``minimal``), ``save_dot_except_mlp``, ``save_qkv_proj``, ``full``, ``offload`` (`spmd.plan.request.remat`).
        attention: ``dot`` or ``flash`` (splash attention, `spmd.plan.request.attention`).
        slices: slices joined over DCN (a ``data`` axis spans them).
        tensor: the tensor axis size of the default 2-D mesh.
        param_spec: overrides the strategy's ``(name, shape) -> spec``.
        hbm_bytes: the per-device memory budget the verdict uses; default the device's HBM.
        moment_dtype: AdamW's first moment, ``float32`` or ``bfloat16`` (MaxText's ``mu_dtype``).
        vocab_tiles: the loss in this many chunks of tokens (MaxText's ``num_vocab_tiling``).
        splash_blocks: the splash kernel's blocks by MaxText's ``sa_block_*`` names (``q=1024,kv=1024``).
        scoped_vmem_kib: the VMEM one kernel may take, in KiB; none: libtpu's default.
        weight_dtype: the stored parameters and second moment (MaxText's ``weight_dtype``: `PlanSettings`).
        fused: sibling projections run as one matmul, MaxText's ``fused_qkv`` and ``fused_mlp``:
            ``"qkv"``, ``"mlp"`` or ``"qkv,mlp"`` (`spmd.plan.request.fused_projections`).

    Raises:
        PlanError, TopologyError, CompilerVersionError, ModelSpecError, TracingError: bad input, with what to change.
    """
    settings = PlanSettings(topology, slices, seq_len, compute_dtype, attention, hbm_bytes, moment_dtype, vocab_tiles,
                            splash_blocks, scoped_vmem_kib, weight_dtype, fused)  # fmt: skip
    return plan_with(model, settings, strategy=strategy, mesh=mesh, global_batch=global_batch, remat=remat,
                     tensor=tensor, param_spec=param_spec)  # fmt: skip


def plan_with(
    model: str | Path | torch.nn.Module, settings: PlanSettings, *, strategy: str = Role.FSDP.value,
    mesh: Mapping[str, int] | None = None, global_batch: int | None = None, remat: str | Remat = "dots",
    tensor: int = 4, param_spec: SpecFn | None = None,
) -> PlanReport:  # fmt: skip
    """`plan` with its shared settings as one checked value (what the advisor runs per candidate)."""
    return plan_program(
        model, settings, strategy=strategy, mesh=mesh, global_batch=global_batch, remat=remat, tensor=tensor,
        param_spec=param_spec,
    )[0]  # fmt: skip


def plan_program(
    model: str | Path | torch.nn.Module, settings: PlanSettings, *, strategy: str = Role.FSDP.value,
    mesh: Mapping[str, int] | None = None, global_batch: int | None = None, remat: str | Remat = "dots",
    tensor: int = 4, param_spec: SpecFn | None = None,
) -> tuple[PlanReport, str]:  # fmt: skip
    """`plan_with`'s report and the optimized HLO it was read from (empty when the program does not
    fit): what a calibration keeps, to predict the step again with other constants
    (`spmd.plan.predict._step_time.predict_step`) without compiling again."""
    req = _request(settings, strategy, mesh, global_batch, remat, tensor)
    module, hf_config = build_meta_model(model)
    seq = resolve_seq_len(settings.seq_len, hf_config)
    sequence = roles.sequence_axes(tuple(req.mesh))
    if sequence:  # context parallelism: checked before anything is traced or compiled
        check_context(seq, math.prod(req.mesh[a] for a in sequence))
        check_takes_positions(module)
        check_no_sliding_window(module, seq)
        check_no_context_axis(settings.splash_blocks)  # type: ignore[arg-type]
    settings.check_model_sequence(seq)
    settings.check_model(module)
    lowered, our_mesh, tools = _lower(req, module, hf_config, seq, param_spec)
    compiled = compile_step(lowered.lowered, settings.compiler_options)
    axes, batch = batch_axes(req.mesh), (req.global_batch, seq)
    predicted = argument_bytes(
        lowered.param_shapes, lowered.param_specs, our_mesh, batch, axes, settings.moment_bytes, sequence,
        settings.weight_bytes,
    )  # fmt: skip
    name = str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__
    return _report(name, req, seq, hf_config, lowered, compiled, predicted, tools), compiled.hlo_text


def _lower(
    req: _Request, module: torch.nn.Module, hf_config: Any, seq: int, param_spec: SpecFn | None
) -> tuple[LoweredStep, Mesh, dict[str, str]]:
    """The target's devices and mesh, the parameter specs (checked for even splits), and the
    lowered step; with the toolchain that lowers it (the partitioner is jax's setting now)."""
    devices = tpu_devices(req.target)
    our_mesh = build_mesh(req.mesh, req.target, devices, req.dcn)
    spec_fn = param_spec or param_spec_for(req.strategy, our_mesh, hf_config)
    check_even_splits(req.strategy, {n: tuple(p.shape) for n, p in module.named_parameters()}, spec_fn, our_mesh)
    gather = roles.param_shard_axes(tuple(req.mesh))
    st = req.settings
    config = TrainStepConfig(
        req.global_batch, seq, st.compute_dtype, req.remat, st.attention, batch_axes(req.mesh), gather,  # type: ignore[arg-type]
        st.moment_dtype, sequence_axes=roles.sequence_axes(tuple(req.mesh)), vocab_tiles=st.vocab_tiles,
        splash_blocks=st.splash_blocks, weight_dtype=st.weight_dtype, fused=st.fused,  # type: ignore[arg-type]
    )  # fmt: skip
    tools = asdict(toolchain(devices))
    return lower_train_step(module, our_mesh, np.asarray(devices), spec_fn, config), our_mesh, tools


def _memory(req: _Request, compiled: CompiledStep, predicted: int) -> MemoryReport:
    chip = req.target.chip
    verdict = dict(
        hbm_bytes=req.settings.budget, predicted_argument_bytes=predicted, largest_allocations=compiled.largest,
        devices_per_chip=chip.devices_per_chip,
    )  # fmt: skip
    if not compiled.fits_compiler:  # libtpu 0.0.52 names the temporaries only: add the arguments
        used = compiled.oom_bytes + (predicted if compiled.oom_temporaries_only else 0)  # type: ignore[operator]
        return MemoryReport(used, compiler_oom_bytes=used, **verdict)  # type: ignore[arg-type]
    accepted = req.settings.budget >= chip.device_hbm_bytes  # libtpu compiled it for this device's HBM
    return MemoryReport.from_memory_analysis(compiled.memory, compiler_accepted=accepted, **verdict)  # type: ignore[return-value]


def _report(
    model: str, req: _Request, seq: int, hf_config: Any, lowered: LoweredStep, compiled: CompiledStep,
    predicted: int, tools: dict[str, str],
) -> PlanReport:  # fmt: skip
    collectives = step_collectives(compiled.hlo_text) if compiled.fits_compiler else []
    step_time = predict_step(compiled.hlo_text, req.target) if compiled.fits_compiler else None
    n_params = sum(math.prod(s) for s in lowered.param_shapes.values())
    target = req.target
    tokens = req.global_batch * seq
    estimate = estimate_step(target, hf_config, n_params, tokens, seq, req.remat, collectives, step_time)
    return PlanReport(
        model=model, topology=target.name, chip=target.chip.name, chips=target.chips, devices=target.devices,
        slices=target.slices, mesh=req.mesh, dcn_mesh=req.dcn, strategy=req.strategy, global_batch=req.global_batch, seq_len=seq,
        compute_dtype=req.settings.compute_dtype, remat=req.remat.value, attention=req.settings.attention.value,  # type: ignore[union-attr]
        vocab_tiles=req.settings.vocab_tiles, splash_blocks=req.settings.splash_blocks.given,  # type: ignore[union-attr]
        scoped_vmem_kib=req.settings.scoped_vmem_kib, weight_dtype=req.settings.weight_dtype,
        fused=req.settings.fused,  # type: ignore[arg-type]
        n_params=n_params,
        scanned_layers=lowered.scanned_layers, memory=_memory(req, compiled, predicted),
        collectives=summarize(collectives), xla_flops=compiled.cost.get("flops", 0.0),
        xla_bytes_accessed=compiled.cost.get("bytes accessed", 0.0), estimate=estimate,
        compile_seconds=compiled.seconds,
        splash_kernels=splash_kernels(compiled.hlo_text), toolchain=dict(tools),
        param_specs={n: str(s) for n, s in lowered.param_specs.items()},
        context_parallel=_context_report(req, seq, hf_config, n_params, collectives),
    )  # fmt: skip


def _context_report(
    req: _Request, seq: int, hf_config: Any, n_params: int, collectives: list[Any]
) -> ContextReport | None:
    """The context axis of a plan that splits the sequence (`ContextReport`), ``None`` otherwise:
    one layer's gathered K (or V) by the formula, and the compiled collectives whose groups span
    the context axis alone."""
    sequence = roles.sequence_axes(tuple(req.mesh))
    if not sequence:
        return None
    axis, names, sizes = sequence[0], tuple(req.mesh), tuple(req.mesh.values())
    shape = model_shape(hf_config, n_params)
    batch = req.global_batch // math.prod(req.mesh[a] for a in batch_axes(req.mesh))
    itemsize = 2 if req.settings.compute_dtype == "bfloat16" else 4
    kv = 0 if shape is None else kv_gather_bytes(
        batch, shape.n_kv_head // req.mesh.get(Role.TENSOR.value, 1), seq, shape.head_dim, itemsize
    )  # fmt: skip
    over = [c for c in collectives if axes_spanned(c.group, sizes, names) == (axis,)]
    return ContextReport(
        axis, req.mesh[axis], seq // req.mesh[axis], kv, 0 if shape is None else shape.n_layer, summarize(over)
    )
