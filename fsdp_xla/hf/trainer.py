"""`FSDPTrainer`: the Hugging Face ``Trainer`` with fsdp_xla in place of torch_xla's FSDP.

``FSDPTrainer(model=..., args=TrainingArguments(fsdp="full_shard", fsdp_config="fsdp_config.json"))``
reads the same ``fsdp_config`` the Trainer documents (`read_fsdp_config`), shards the model with
`fsdp_xla.FSDP` when the trainer is built (a model from `fsdp_xla.deferred_init` is
initialized straight into its shards), gives each device its part of every batch
(``per_device_train_batch_size`` is the global batch, as under SPMD), and otherwise leaves the
Trainer alone: its optimizer, scheduler, logging and evaluation.

It runs on either backend, chosen once when the trainer is built: under ``torchrun`` (the
process group is up) on DTensor, torch's ``fully_shard`` per unit (`_dtensor_backend`); in one
process with torch_xla on GSPMD (`_gspmd_backend`). What each changes in the Trainer is said
there. On both it:

- turns the Trainer's own XLA FSDP flags off after reading the config: its v1 path wraps with
  ``XlaFullyShardedDataParallel`` and its v2 path ignores ``xla_fsdp_settings``; in 5.23
  both also leave the optimizer uncreated when the model is wrapped;
- ``_wrap_model`` returns the model as is (it is sharded in place);
- replaces the ``adamw_torch_fused`` default, which does not run on XLA tensors, by
  ``adamw_torch`` (on both, so the same arguments train the same way).
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from collections.abc import Mapping
from typing import Any

import torch

import spmd
from fsdp_xla.api import FSDP
from fsdp_xla.errors import FSDPTypeError
from fsdp_xla.hf._dtensor_backend import TORCHRUN_HINT, DTensorTrainerBackend
from fsdp_xla.hf._gspmd_backend import GspmdTrainerBackend, batch_axes, batch_sharding
from fsdp_xla.hf._parallelism import context_inputs, take_parallelism_config
from fsdp_xla.hf.config import HFConfigError, HFFSDPConfig, read_fsdp_config
from mesh import Mesh, ParallelDims, as_mesh, roles
from spmd.logical_axes import ShardingPlan

try:
    from transformers import Trainer
except ImportError as e:  # pragma: no cover - transformers is an optional dependency
    raise ImportError("fsdp_xla.hf.trainer needs transformers: pip install 'xla-spmd[hf]'.") from e

__all__ = ["FSDPTrainer", "batch_axes", "batch_sharding"]


def _trainer_backend_for(batch_specs: Mapping[str, Any] | None) -> DTensorTrainerBackend | GspmdTrainerBackend:
    """DTensor once torch.distributed is up (torchrun; TrainingArguments starts the process
    group), else GSPMD where torch_xla is installed.

    Raises:
        HFConfigError: neither (one process, no torch_xla).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return DTensorTrainerBackend(batch_specs)
    if importlib.util.find_spec("torch_xla") is not None:
        return GspmdTrainerBackend(batch_specs)
    raise HFConfigError(
        "FSDPTrainer found no torch.distributed process group and no torch_xla: without torch_xla it runs on "
        f"DTensor, one process per device. Launch the script with torchrun (e.g. `{TORCHRUN_HINT}`), and build "
        "TrainingArguments before FSDPTrainer (it starts the process group)."
    )


def _replace_the_fused_adamw_default(training_args: Any) -> None:
    """``adamw_torch_fused`` (the Trainer's default) does not run on XLA tensors."""
    if (
        training_args is not None
        and str(getattr(training_args.optim, "value", training_args.optim)) == "adamw_torch_fused"
    ):
        from transformers.training_args import OptimizerNames

        training_args.optim = OptimizerNames.ADAMW_TORCH


def _check_mesh_and_plan(mesh: object, sharding_plan: object) -> Mesh | None:
    """``mesh`` as a `Mesh` (a torch_xla Mesh or a DeviceMesh converted), ``sharding_plan`` a `ShardingPlan`.

    Raises:
        MeshTypeError: ``mesh`` is not a mesh.
        FSDPTypeError: ``sharding_plan`` is not a `ShardingPlan`.
    """
    if sharding_plan is not None and not isinstance(sharding_plan, ShardingPlan):
        raise FSDPTypeError(
            f"FSDPTrainer(sharding_plan=...) takes a spmd.logical_axes.ShardingPlan (e.g. fsdp_xla.hf.gpt2_plan()) "
            f"or None, got {sharding_plan!r:.60} ({type(sharding_plan).__name__})."
        )
    return None if mesh is None else as_mesh(mesh, "FSDPTrainer(mesh=...)")


def _check_before_the_trainer(training_args: Any, mesh: Mesh | None) -> None:
    """What transformers' own __init__ would fail on with an unrelated message, said first.

    Raises:
        HFConfigError: FSDP on without ``"xla": true``, transformers' gradient checkpointing
            (it fails on XLA; ``xla_fsdp_grad_ckpt`` is the FSDP one), or a mesh without ``fsdp``.
    """
    if mesh is not None and not roles.param_shard_axes(mesh.axis_names):
        raise HFConfigError(
            f"FSDPTrainer(mesh=...) shards parameters over the axes named 'fsdp' and 'context', but "
            f"{mesh.describe()} has neither. Name one axis 'fsdp' (e.g. Mesh(ids, (n, t), ('fsdp', 'tensor'))), "
            "or build the mesh with mesh.ParallelDims."
        )
    if training_args is None:
        return
    config = getattr(training_args, "fsdp_config", None) or {}
    if training_args.fsdp and isinstance(config, dict) and not config.get("xla"):
        raise HFConfigError(
            'fsdp_config must hold "xla": true for FSDPTrainer (FSDP on XLA). Without it transformers takes its '
            'CUDA FSDP path and stops with "Using fsdp only works in distributed training". Add "xla": true '
            "to fsdp_config.json (the other keys may stay as they are)."
        )
    if getattr(training_args, "gradient_checkpointing", False) or getattr(
        training_args, "activation_checkpointing", False
    ):
        raise HFConfigError(
            "TrainingArguments(gradient_checkpointing=True / activation_checkpointing=True) is transformers' "
            "checkpointing, which fails on XLA "
            "(AttributeError: module 'torch' has no attribute 'xla', transformers 5.23). With FSDPTrainer turn on "
            'FSDP\'s: "xla_fsdp_grad_ckpt": true in fsdp_config.json, and leave the TrainingArguments flag out.'
        )


class FSDPTrainer(Trainer):
    """``transformers.Trainer`` training with `fsdp_xla.FSDP` on GSPMD or DTensor (module docstring).

    Args:
        *args: the Trainer's own positional arguments.
        **kwargs: the Trainer's own keyword arguments; ``args`` (TrainingArguments) must enable
            ``fsdp`` and give an ``fsdp_config`` (path or dict).
        mesh: the device mesh; default all devices (ranks under torchrun) on one ``fsdp`` axis.
            On GSPMD it becomes the global mesh.
        sharding_plan: a `spmd.logical_axes.ShardingPlan` (e.g. `fsdp_xla.hf.gpt2_plan()`)
            for 2-D fsdp x tensor layouts; its specs become FSDP's ``param_spec_fn``.
        batch_specs: GSPMD only: a spec per batch key where the default (the batch dim over the
            data axes) does not fit.

    Raises:
        HFConfigError: ``fsdp`` is not enabled, or the config has a bad key (see
            `read_fsdp_config`), or the batch size does not divide by the ``fsdp`` axis, or
            there is neither a process group nor torch_xla.
        MeshTypeError: ``mesh`` is not a mesh.
        FSDPTypeError: ``sharding_plan`` is not a `ShardingPlan`.
    """

    def __init__(
        self,
        *args: Any,
        mesh: Mesh | None = None,
        sharding_plan: ShardingPlan | None = None,
        batch_specs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """``mesh``: the mesh (default: all devices on one ``fsdp`` axis); ``sharding_plan``: a 2-D
        plan for the parameters (`spmd.logical_axes`); ``batch_specs``: a spec per batch key
        where the default (the batch dim over the data axes) does not fit, e.g.
        ``{"pixel_values": P("fsdp", None, None, None)}``."""
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        self._fsdp_backend = _trainer_backend_for(batch_specs)
        self._fsdp_backend.before_trainer(training_args)
        mesh = _check_mesh_and_plan(mesh, sharding_plan)
        self.parallel_dims = self._take_parallelism(training_args, mesh, sharding_plan)
        if self.parallel_dims is not None:
            mesh = self.parallel_dims.mesh()
        _check_before_the_trainer(training_args, mesh)
        _replace_the_fused_adamw_default(training_args)
        super().__init__(*args, **kwargs)
        if not self.args.fsdp:
            raise HFConfigError(
                "FSDPTrainer needs FSDP turned on: TrainingArguments(fsdp='full_shard', fsdp_config='fsdp_config.json') "
                "or --fsdp full_shard --fsdp_config fsdp_config.json."
            )
        self.fsdp_xla_config: HFFSDPConfig = read_fsdp_config(self.args.fsdp_config or {})
        # The Trainer's own XLA FSDP would wrap again (and in transformers 5.23 never builds the optimizer).
        self.is_fsdp_xla_enabled = False
        self.is_fsdp_xla_v1_enabled = False
        self.is_fsdp_xla_v2_enabled = False
        self.fsdp_mesh = self._fsdp_backend.mesh(mesh, self.args)
        if not self.args.dataloader_drop_last:
            warnings.warn(
                "FSDPTrainer sets dataloader_drop_last=True: every batch must divide by the data axes.",
                UserWarning,
                stacklevel=2,
            )
            self.args.dataloader_drop_last = True
        self._shard_model(sharding_plan)
        dims = self.parallel_dims
        self.context_parallel = (
            spmd.context_parallel(self.model, self.fsdp_mesh) if dims is not None and dims.context > 1 else None
        )
        if self.context_parallel is not None:
            self._fsdp_backend.after_context_parallel(self.model)

    def _take_parallelism(
        self, training_args: Any, mesh: Mesh | None, sharding_plan: ShardingPlan | None
    ) -> ParallelDims | None:
        """accelerate's ParallelismConfig of ``training_args`` as the mesh's dims (`_parallelism`).

        Raises:
            HFConfigError: both a config and ``mesh``; ``tp_size > 1`` without a ``sharding_plan``
                (nothing would be split over the tensor axis); or a config this backend cannot run.
        """
        if training_args is None or getattr(training_args, "parallelism_config", None) is None:
            return None
        if mesh is not None:
            raise HFConfigError(
                "FSDPTrainer got both mesh=... and TrainingArguments(parallelism_config=...), two meshes. Keep one: "
                "the config's sizes build the mesh (mesh.ParallelDims), or pass the mesh alone."
            )
        dims = take_parallelism_config(training_args, self._fsdp_backend.world())
        self._fsdp_backend.check_parallelism(dims)
        if dims.tensor > 1 and sharding_plan is None:
            raise HFConfigError(
                f"ParallelismConfig(tp_size={dims.tensor}) splits the mesh's tensor axis, and no sharding_plan says "
                "what to split over it. Pass FSDPTrainer(sharding_plan=fsdp_xla.hf.llama_plan()) (or gpt2_plan())."
            )
        return dims

    def _prepare_context_parallel_inputs(self, model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[Any, Any]:
        """The Trainer's hook for context parallelism: this process's block of the step's batch
        (`fsdp_xla.hf._parallelism.context_inputs`), computed in place of accelerate's."""
        if self.context_parallel is None:
            return super()._prepare_context_parallel_inputs(model, inputs)
        gather = self._fsdp_backend.context_rows(self.context_parallel)
        return contextlib.nullcontext, context_inputs(self.context_parallel, inputs, gather)

    @property
    def backend(self) -> str:
        """``"torch_xla"`` (GSPMD, one process) or ``"dtensor"`` (torchrun, FSDP2)."""
        return self._fsdp_backend.name

    def _shard_model(self, sharding_plan: ShardingPlan | None) -> None:
        model = self.model
        if self.fsdp_xla_config.gradient_checkpointing and getattr(getattr(model, "config", None), "use_cache", False):
            model.config.use_cache = False  # a KV cache is meaningless while recomputing
        kwargs_fsdp = self.fsdp_xla_config.fsdp_kwargs(model)
        kwargs_fsdp["mixed_precision"] = self._fsdp_backend.mixed_precision(kwargs_fsdp["mixed_precision"], self.args)
        if sharding_plan is not None:
            kwargs_fsdp["param_spec_fn"] = sharding_plan.param_spec_fn(self.fsdp_mesh)
        FSDP(model, mesh=self.fsdp_mesh, shard_output=None, **kwargs_fsdp)
        self._fsdp_backend.after_sharding(model)
        self.model_wrapped = model

    def _wrap_model(self, model: torch.nn.Module, training: bool = True, dataloader: Any = None) -> torch.nn.Module:
        return model  # sharded in place when the trainer was built

    def get_train_dataloader(self) -> Any:
        """The Trainer's train dataloader, each device given its part of every batch."""
        return self._fsdp_backend.shard_batches(super().get_train_dataloader())

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """The Trainer's eval dataloader, each device given its part of every batch."""
        return self._fsdp_backend.shard_batches(super().get_eval_dataloader(eval_dataset))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model: on DTensor in fsdp_xla's sharded format (``<output_dir>/fsdp_xla``, every
        rank its shards; `fsdp_xla.checkpoint.consolidate` merges it) with ``config.json``; on
        GSPMD as the Trainer does. `save_pretrained` writes consolidated safetensors."""
        self._fsdp_backend.save_model(self, output_dir or self.args.output_dir, _internal_call, super().save_model)

    def save_pretrained(self, output_dir: str | None = None) -> None:
        """The trained model as ``from_pretrained`` reads it (consolidated safetensors and config),
        written by rank 0 (every rank must call it)."""
        self._fsdp_backend.save_pretrained(self, output_dir or self.args.output_dir)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        self._fsdp_backend.save_optimizer_and_scheduler(self, output_dir, super()._save_optimizer_and_scheduler)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        self._fsdp_backend.load_model(self, resume_from_checkpoint, model, super()._load_from_checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        self._fsdp_backend.load_optimizer_and_scheduler(self, checkpoint, super()._load_optimizer_and_scheduler)
