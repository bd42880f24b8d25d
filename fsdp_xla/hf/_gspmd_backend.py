"""`FSDPTrainer` on torch_xla's GSPMD: one process drives every device.

- SPMD is turned on before the Trainer picks its device (``xr.use_spmd()`` must come first);
- the mesh defaults to every device on one ``fsdp`` axis and becomes the global mesh;
- ``per_device_train_batch_size`` is the global batch (one process), split over the data axes
  by the dataloaders' input sharding (the Trainer sets one only for its FSDPv2 path);
- checkpoints are the Trainer's own (``save_model`` through torch_xla).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from fsdp_xla.hf._parallelism import keep_token_layout_in_loss
from fsdp_xla.hf.config import HFConfigError
from mesh import Mesh, ParallelDims, roles, set_global_mesh
from spmd.backend import torch_xla_backend
from spmd.compat.sharding_spec import ShardingSpec
from spmd.devices import enable_spmd
from spmd.errors import SpmdModeError

__all__ = ["GspmdTrainerBackend", "batch_axes", "batch_sharding"]


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes a batch is split over: ``data`` and ``fsdp``, those the mesh has, in mesh order."""
    names = mesh.axis_names or ()
    return tuple(a for a in names if a in roles.batch_axes(names))


def batch_sharding(mesh: Mesh, specs: Mapping[str, Any] | None = None) -> Any:
    """How the dataloader lays each batch key out: the batch dim (dim 0) over the data axes, the
    rest replicated, for every key of any rank (a 0-d tensor is replicated); a key of ``specs``
    takes its own spec. A spec that splits a dim its tensor lacks raises `ShardingError` when
    the batch is sent: nothing is replicated silently.

    Raises:
        HFConfigError: ``specs`` is not a mapping of key to spec.
    """
    default = ShardingSpec(mesh, (batch_axes(mesh),))
    if specs is None:
        return default
    if not isinstance(specs, Mapping) or not all(isinstance(k, str) for k in specs):
        raise HFConfigError(
            f"batch_specs must map batch keys to specs, e.g. {{'pixel_values': P('fsdp')}}; got {specs!r:.200}."
        )
    return _KeyedSharding(default, {k: ShardingSpec(mesh, v) for k, v in specs.items()})


class _KeyedSharding(dict):
    """torch_xla's loaders take a dict of ShardingSpec per batch key and refuse a key it lacks;
    this one answers every key: its own spec, else the default."""

    def __init__(self, default: ShardingSpec, specs: dict[str, ShardingSpec]) -> None:
        super().__init__(specs)
        self.default = default

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> ShardingSpec:
        return self.default


class GspmdTrainerBackend:
    """The torch_xla side of `FSDPTrainer` (module docstring)."""

    name = "torch_xla"

    def __init__(self, batch_specs: Mapping[str, Any] | None) -> None:
        self._batch_specs = batch_specs
        self._batch_sharding: Any = None

    def before_trainer(self, training_args: Any) -> None:
        """SPMD on, before TrainingArguments' device is used by the Trainer."""
        try:
            enable_spmd()
        except SpmdModeError as e:
            raise SpmdModeError(
                f"{e} With the Trainer: call spmd.enable_spmd() before creating TrainingArguments (which picks the "
                "XLA device and may place tensors on it)."
            ) from e

    def world(self) -> int:
        """The devices this process drives."""
        return torch_xla_backend.device_count()

    def check_parallelism(self, dims: ParallelDims) -> None:
        """Every ParallelismConfig runs here (``tp_size`` with a ``sharding_plan`` naming ``tensor``)."""

    def context_rows(self, plan: Any) -> None:
        """Nothing to join: the one process holds every row."""
        return None

    def after_context_parallel(self, model: Any) -> None:
        """A causal LM's loss over its ``[rows, seq]`` tokens as they are split, not flattened
        (`fsdp_xla.hf._parallelism.causal_lm_loss_by_token`: flattening made GSPMD gather the
        logits along the sequence every step)."""
        keep_token_layout_in_loss(model)

    def mesh(self, mesh: Mesh | None, training_args: Any) -> Mesh:
        """The mesh (the global one from now on); the batch must divide by its data axes.

        Raises:
            HFConfigError: the batch does not divide by the data axes.
        """
        n = torch_xla_backend.device_count()
        mesh = mesh or ParallelDims(fsdp=n).mesh()
        set_global_mesh(mesh)
        ways = math.prod(mesh.axis_size(a) for a in batch_axes(mesh))
        per_device_batch = training_args.per_device_train_batch_size
        if per_device_batch % ways:
            raise HFConfigError(
                f"per_device_train_batch_size={per_device_batch} is the global batch under SPMD and must divide by the "
                f"data axes ({ways} devices of {mesh.describe()}). Use a multiple of {ways}."
            )
        self._batch_sharding = batch_sharding(mesh, self._batch_specs)
        return mesh

    def mixed_precision(self, from_config: Any, training_args: Any) -> Any:
        """The config's (the Trainer's ``bf16`` keeps its own meaning on XLA: accelerate's autocast)."""
        return from_config

    def shard_batches(self, loader: Any) -> Any:
        """Each batch split over the data axes as it is sent to the devices."""
        if hasattr(loader, "_parallel_loader_kwargs"):
            loader._parallel_loader_kwargs["input_sharding"] = self._batch_sharding
        return loader

    def after_sharding(self, model: Any) -> None:
        """Nothing: accelerate's XLA preparation leaves a GSPMD model as it is."""

    # Checkpoints: the Trainer's own on XLA.

    def save_model(self, trainer: Any, output_dir: str, internal: bool, default: Callable[..., None]) -> None:
        default(output_dir, _internal_call=internal)

    def save_optimizer_and_scheduler(self, trainer: Any, output_dir: str, default: Callable[..., None]) -> None:
        default(output_dir)

    def load_model(self, trainer: Any, checkpoint: str, model: Any, default: Callable[..., None]) -> None:
        default(checkpoint, model)

    def load_optimizer_and_scheduler(self, trainer: Any, checkpoint: str | None, default: Callable[..., None]) -> None:
        default(checkpoint)

    def save_pretrained(self, trainer: Any, output_dir: str) -> None:
        trainer.save_model(output_dir)  # the Trainer's TPU save: consolidated from the XLA tensors
