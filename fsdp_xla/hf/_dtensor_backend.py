"""`FSDPTrainer` on DTensor: one process per rank (``torchrun``), FSDP2 ``fully_shard`` per unit.

What it changes in the Trainer, and why (transformers 5.24, accelerate 1.15):

- ``per_device_train_batch_size`` keeps its SPMD meaning, the global batch, so the same
  TrainingArguments train the same way on both backends: accelerate's ``split_batches=True``
  gives rank ``r`` rows ``[r b/n, (r+1) b/n)`` of each global batch (the sampler's order is the
  same on every rank), and ``b`` must divide by the ranks;
- the model is marked as prepared for accelerate (``_is_accelerate_prepared``, accelerate's own
  guard against wrapping twice): on ``MULTI_CPU``/``MULTI_GPU`` it would wrap the FSDP model in
  DDP (and refuse DTensor parameters), and with ``bf16`` it would add an autocast on top of
  FSDP's mixed precision;
- mixed precision is FSDP2's ``MixedPrecisionPolicy`` from ``compute_dtype`` in the config or
  the Trainer's ``bf16``/``fp16``, parameters kept in float32;
- ``save_model`` and checkpoints write fsdp_xla's sharded format (`fsdp_xla.checkpoint`, each rank
  its shards, the optimizer state by parameter name) in ``<dir>/fsdp_xla``; ``resume_from_checkpoint``
  reads it back. Scheduler, RNG and trainer state stay the Trainer's. `FSDPTrainer.save_pretrained`
  writes consolidated safetensors from rank 0.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fsdp_xla.hf.config import HFConfigError
from fsdp_xla.policies import MixedPrecision
from mesh import Mesh, ParallelDims
from spmd.backend import process_count, process_index

__all__ = ["DTensorTrainerBackend", "SHARDED_DIR", "TORCHRUN_HINT"]

SHARDED_DIR = "fsdp_xla"  # the sharded checkpoint inside a Trainer checkpoint directory
TORCHRUN_HINT = "torchrun --nproc_per_node 4 your_script.py"
_SCHEDULER = "scheduler.pt"


def _is_main() -> bool:
    return process_index() == 0


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer``."""
    return getattr(optimizer, "optimizer", optimizer)


class DTensorTrainerBackend:
    """The DTensor side of `FSDPTrainer` (module docstring)."""

    name = "dtensor"

    def __init__(self, batch_specs: Any) -> None:
        if batch_specs is not None:
            raise HFConfigError(
                "FSDPTrainer(batch_specs=...) lays batch keys out over a GSPMD mesh; on the dtensor backend "
                "(torchrun) each rank takes its rows of every key. Leave batch_specs out."
            )

    def before_trainer(self, training_args: Any) -> None:
        """accelerate's ``split_batches`` on, before the Trainer builds its Accelerator.

        Raises:
            HFConfigError: ``load_best_model_at_end``, which reads the Trainer's weight files.
        """
        if training_args is None:
            return
        if training_args.load_best_model_at_end:
            raise HFConfigError(
                "TrainingArguments(load_best_model_at_end=True) reloads the Trainer's weight files, and on the dtensor "
                "backend FSDPTrainer's checkpoints are sharded (<checkpoint>/fsdp_xla). Leave it out and load the best "
                "checkpoint with fsdp_xla.checkpoint.load_sharded(state.best_model_checkpoint + '/fsdp_xla', model)."
            )
        training_args.accelerator_config.split_batches = True

    def world(self) -> int:
        """The processes (one per device)."""
        return process_count()

    def check_parallelism(self, dims: ParallelDims) -> None:
        """What a ParallelismConfig may ask of this backend.

        Raises:
            HFConfigError: tensor parallelism (``tp_size > 1``): FSDPTrainer's tensor split is a
                GSPMD ``sharding_plan``; on DTensor it is torch's ``parallelize_module``, which
                the Trainer does not apply.
        """
        if dims.tensor > 1:
            raise HFConfigError(
                f"ParallelismConfig(tp_size={dims.tensor}): on the dtensor backend FSDPTrainer shards with FSDP2 over "
                "data x fsdp x context and does not apply tensor parallelism (torch's parallelize_module). Use "
                "tp_size=1 here (dp_shard_size and cp_size split the rest), or the torch_xla backend with a "
                "sharding_plan (fsdp_xla.hf.llama_plan())."
            )

    def after_context_parallel(self, model: Any) -> None:
        """Nothing: each process computes the loss of its own tokens, a plain tensor."""

    def context_rows(self, plan: Any) -> Callable[[torch.Tensor], torch.Tensor]:
        """Joins, in the context axis's order, the rows each process of a context group was given:
        accelerate splits every global batch over all processes, and a context group shares its
        rows (ranks ``f x context + c``, `ParallelDims`' order, hold consecutive rows)."""
        import torch.distributed as dist

        group = plan.group()

        def gather(t: torch.Tensor) -> torch.Tensor:
            out = t.new_empty((dist.get_world_size(group) * t.shape[0], *t.shape[1:]))
            dist.all_gather_into_tensor(out, t.contiguous(), group=group)
            return out

        return gather

    def mesh(self, mesh: Mesh | None, training_args: Any) -> Mesh:
        """The mesh (default: every rank on one ``fsdp`` axis); accelerate must see every rank, and
        the batch must divide by the ranks.

        Raises:
            HFConfigError: accelerate sees fewer processes than torchrun started, or the batch
                does not divide by the ranks.
        """
        world = process_count()
        if training_args.world_size != world:
            raise HFConfigError(
                f"torchrun started {world} processes but accelerate sees {training_args.world_size} "
                f"({training_args.distributed_state.distributed_type}): it would neither split the batches nor "
                "average the logged loss over the ranks. On CPU pass TrainingArguments(use_cpu=True) (--use_cpu), "
                "which makes accelerate run one gloo process per rank (MULTI_CPU)."
            )
        mesh = mesh or ParallelDims(fsdp=world).mesh()
        per_device_batch = training_args.per_device_train_batch_size
        if per_device_batch % world:
            raise HFConfigError(
                f"per_device_train_batch_size={per_device_batch} is the global batch (as on GSPMD): each of the "
                f"{world} ranks takes its rows of it, so it must divide by {world}. Use a multiple of {world}."
            )
        return mesh

    def mixed_precision(self, from_config: MixedPrecision | None, training_args: Any) -> MixedPrecision | None:
        """The config's ``compute_dtype``, else the Trainer's ``bf16``/``fp16``.

        Raises:
            HFConfigError: the config and the Trainer ask for different compute dtypes.
        """
        wanted = torch.bfloat16 if training_args.bf16 else torch.float16 if training_args.fp16 else None
        if from_config is None:
            return None if wanted is None else MixedPrecision(wanted)
        if wanted is not None and wanted != from_config.param_dtype:
            raise HFConfigError(
                f"fsdp_config computes in {from_config.param_dtype} (xla_fsdp_settings.compute_dtype) but "
                f"TrainingArguments asks for {wanted} (bf16/fp16). Keep one of them."
            )
        return from_config

    def shard_batches(self, loader: Any) -> Any:
        return loader  # accelerate's split_batches gives each rank its rows

    def after_sharding(self, model: torch.nn.Module) -> None:
        """No DDP around FSDP, and no autocast over FSDP's mixed precision (accelerate's guard)."""
        model._is_accelerate_prepared = True

    # Checkpoints: called by FSDPTrainer in place of the Trainer's own.

    def save_model(self, trainer: Any, output_dir: str, internal: bool, default: Callable[..., None]) -> None:
        """The model in fsdp_xla's sharded format (every rank writes its shards), then the config from
        rank 0. In a Trainer checkpoint (``internal``) the optimizer is saved in the same sharded
        save, first: a save that is refused (another run's checkpoint in ``output_dir``) then
        refuses before any file of the checkpoint is written, where the Trainer's order (model
        files, then the optimizer) would have rewritten that run's ``config.json`` and
        ``training_args.bin`` first."""
        from fsdp_xla.checkpoint import save_sharded

        optimizer = trainer.optimizer if internal and not trainer.args.save_only_model else None
        save_sharded(Path(output_dir) / SHARDED_DIR, trainer.model, None if optimizer is None else _inner(optimizer))
        if _is_main():
            config = getattr(trainer.model, "config", None)
            if config is not None:
                config.save_pretrained(output_dir)
            if trainer.processing_class is not None:
                trainer.processing_class.save_pretrained(output_dir)
            torch.save(trainer.args, os.path.join(output_dir, "training_args.bin"))
        _barrier()

    def save_optimizer_and_scheduler(self, trainer: Any, output_dir: str, default: Callable[..., None]) -> None:
        """The scheduler from rank 0, as the Trainer does; the optimizer went into the model's
        sharded save (`save_model`), which the Trainer calls just before."""
        if _is_main():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's "please also save or load the state of the optimizer"
                torch.save(trainer.lr_scheduler.state_dict(), os.path.join(output_dir, _SCHEDULER))
        _barrier()

    def load_model(self, trainer: Any, checkpoint: str, model: Any, default: Callable[..., None]) -> None:
        """The model's shards from ``<checkpoint>/fsdp_xla``."""
        from fsdp_xla.checkpoint import load_sharded

        load_sharded(_sharded(checkpoint), model if model is not None else trainer.model)

    def load_optimizer_and_scheduler(self, trainer: Any, checkpoint: str | None, default: Callable[..., None]) -> None:
        """Model and optimizer from ``<checkpoint>/fsdp_xla``, the scheduler from ``scheduler.pt``."""
        from fsdp_xla.checkpoint import load_sharded

        if checkpoint is None:
            return
        load_sharded(_sharded(checkpoint), trainer.model, _inner(trainer.optimizer))
        scheduler = Path(checkpoint) / _SCHEDULER
        if scheduler.is_file():
            trainer.lr_scheduler.load_state_dict(torch.load(scheduler, weights_only=True))

    def save_pretrained(self, trainer: Any, output_dir: str) -> None:
        """Consolidated safetensors (``save_pretrained``) from rank 0; each full tensor is gathered
        in turn, and only rank 0 keeps it."""
        from torch.distributed.tensor import DTensor

        full: dict[str, torch.Tensor] = {}
        by_id: dict[int, torch.Tensor] = {}
        for name, t in trainer.model.state_dict(keep_vars=True).items():
            if id(t) not in by_id:
                value = t.full_tensor() if isinstance(t, DTensor) else t
                by_id[id(t)] = value.detach().cpu() if _is_main() else value[:0]
            full[name] = by_id[id(t)]
        if _is_main():
            trainer.model.save_pretrained(output_dir, state_dict=full)
        _barrier()


def _sharded(checkpoint: str) -> Path:
    """``<checkpoint>/fsdp_xla``.

    Raises:
        HFConfigError: the checkpoint has none (another backend's, or a Trainer without FSDPTrainer).
    """
    path = Path(checkpoint) / SHARDED_DIR
    if not path.is_dir():
        raise HFConfigError(
            f"resume_from_checkpoint={checkpoint!r} holds no fsdp_xla sharded checkpoint ({SHARDED_DIR}/): on the "
            "dtensor backend FSDPTrainer saves and resumes only its sharded format. Pass a checkpoint directory that "
            "FSDPTrainer wrote under torchrun."
        )
    return path
