"""`FSDPTrainer`: the Hugging Face ``Trainer`` with fsdp_xla in place of torch_xla's FSDP.

``FSDPTrainer(model=..., args=TrainingArguments(fsdp="full_shard", fsdp_config="fsdp_config.json"))``
reads the same ``fsdp_config`` the Trainer documents (`read_fsdp_config`), shards the model with
`fsdp_xla.FSDP` when the trainer is built (a model from `fsdp_xla.deferred_init` is
initialized straight into its shards), shards each batch key on its batch dim over the data
axes (``data``/``fsdp``; `batch_sharding`, per-key specs where given), and otherwise
leaves the Trainer alone: its optimizer, scheduler, logging, evaluation and ``save_model``.

What it changes in the Trainer, and why (transformers 5.23):

- turns SPMD on before the Trainer picks its device (``xr.use_spmd()`` must come first);
- turns the Trainer's own XLA FSDP flags off after reading the config: its v1 path wraps with
  ``XlaFullyShardedDataParallel`` and its v2 path ignores ``xla_fsdp_settings``; in 5.23
  both also leave the optimizer uncreated when the model is wrapped;
- ``_wrap_model`` returns the model as is (it is sharded in place);
- replaces the ``adamw_torch_fused`` default, which does not run on XLA tensors, by
  ``adamw_torch``;
- sets the dataloaders' input sharding (the Trainer does it only for its FSDPv2 path).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fsdp_xla.api import FSDP
from fsdp_xla.errors import FSDPTypeError
from fsdp_xla.hf.config import HFConfigError, HFFSDPConfig, read_fsdp_config
from mesh import Mesh, as_mesh, set_global_mesh
from spmd._backend import backend
from spmd.compat.sharding_spec import ShardingSpec
from spmd.devices import enable_spmd
from spmd.errors import SpmdModeError
from spmd.sharding_plan import ShardingPlan

try:
    from transformers import Trainer
except ImportError as e:  # pragma: no cover - transformers is an optional dependency
    raise ImportError("fsdp_xla.hf.trainer needs transformers: pip install 'xla-spmd[hf]'.") from e

__all__ = ["FSDPTrainer", "batch_axes", "batch_sharding"]


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes a batch is split over: ``data`` and ``fsdp``, those the mesh has, in mesh order."""
    return tuple(a for a in mesh.axis_names or () if a in ("data", "fsdp"))


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
            f"FSDPTrainer(sharding_plan=...) takes a spmd.sharding_plan.ShardingPlan (e.g. fsdp_xla.hf.gpt2_plan()) "
            f"or None, got {sharding_plan!r:.60} ({type(sharding_plan).__name__})."
        )
    return None if mesh is None else as_mesh(mesh, "FSDPTrainer(mesh=...)")


def _check_before_the_trainer(training_args: Any, mesh: Mesh | None) -> None:
    """What transformers' own __init__ would fail on with an unrelated message, said first.

    Raises:
        HFConfigError: FSDP on without ``"xla": true``, transformers' gradient checkpointing
            (it fails on XLA; ``xla_fsdp_grad_ckpt`` is the FSDP one), or a mesh without ``fsdp``.
    """
    if mesh is not None and "fsdp" not in (mesh.axis_names or ()):
        raise HFConfigError(
            f"FSDPTrainer(mesh=...) shards parameters on an axis named 'fsdp', but {mesh.describe()} has none. "
            "Name one axis 'fsdp' (e.g. Mesh(ids, (n, t), ('fsdp', 'tensor')))."
        )
    if training_args is None:
        return
    config = getattr(training_args, "fsdp_config", None) or {}
    if getattr(training_args, "fsdp", None) and isinstance(config, dict) and not config.get("xla"):
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
    """``transformers.Trainer`` training with `fsdp_xla.FSDP` on GSPMD (module docstring).

    Args:
        *args: the Trainer's own positional arguments.
        **kwargs: the Trainer's own keyword arguments; ``args`` (TrainingArguments) must enable
            ``fsdp`` and give an ``fsdp_config`` (path or dict).
        mesh: the device mesh; default all devices on one ``fsdp`` axis. It becomes the global
            mesh.
        sharding_plan: a `spmd.sharding_plan.ShardingPlan` (e.g. `fsdp_xla.hf.gpt2_plan()`)
            for 2-D fsdp x tensor layouts; its specs become FSDP's ``param_spec_fn``.

    Raises:
        HFConfigError: ``fsdp`` is not enabled, or the config has a bad key (see
            `read_fsdp_config`), or the batch size does not divide by the ``fsdp`` axis.
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
        plan for the parameters (`spmd.sharding_plan`); ``batch_specs``: a spec per batch key
        where the default (the batch dim over the data axes) does not fit, e.g.
        ``{"pixel_values": P("fsdp", None, None, None)}``."""
        try:
            enable_spmd()
        except SpmdModeError as e:
            raise SpmdModeError(
                f"{e} With the Trainer: call spmd.enable_spmd() before creating TrainingArguments (which picks the "
                "XLA device and may place tensors on it)."
            ) from e
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        mesh = _check_mesh_and_plan(mesh, sharding_plan)
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
        self._set_mesh(mesh)
        self._batch_sharding = batch_sharding(self.fsdp_mesh, batch_specs)
        self._shard_model(sharding_plan)

    def _set_mesh(self, mesh: Mesh | None) -> None:
        """The mesh (the global one from now on), and the batch size it needs."""
        n = backend.device_count()
        self.fsdp_mesh = mesh or Mesh(np.arange(n), (n,), ("fsdp",))
        set_global_mesh(self.fsdp_mesh)
        ways = math.prod(self.fsdp_mesh.axis_size(a) for a in batch_axes(self.fsdp_mesh))
        batch = self.args.per_device_train_batch_size
        if batch % ways:
            raise HFConfigError(
                f"per_device_train_batch_size={batch} is the global batch under SPMD and must divide by the data axes "
                f"({ways} devices of {self.fsdp_mesh.describe()}). Use a multiple of {ways}."
            )
        if not self.args.dataloader_drop_last:
            warnings.warn(
                "FSDPTrainer sets dataloader_drop_last=True: every batch must divide by the data axes.",
                UserWarning,
                stacklevel=3,
            )
            self.args.dataloader_drop_last = True

    def _shard_model(self, sharding_plan: ShardingPlan | None) -> None:
        model = self.model
        if self.fsdp_xla_config.gradient_checkpointing and getattr(getattr(model, "config", None), "use_cache", False):
            model.config.use_cache = False  # a KV cache is meaningless while recomputing
        kwargs_fsdp = self.fsdp_xla_config.fsdp_kwargs(model)
        if sharding_plan is not None:
            kwargs_fsdp["param_spec_fn"] = sharding_plan.param_spec_fn(self.fsdp_mesh)
        FSDP(model, mesh=self.fsdp_mesh, shard_output=None, **kwargs_fsdp)
        self.model_wrapped = model

    def _wrap_model(self, model: torch.nn.Module, training: bool = True, dataloader: Any = None) -> torch.nn.Module:
        return model  # sharded in place when the trainer was built

    def _shard_batches(self, loader: Any) -> Any:
        if hasattr(loader, "_parallel_loader_kwargs"):
            loader._parallel_loader_kwargs["input_sharding"] = self._batch_sharding
        return loader

    def get_train_dataloader(self) -> Any:
        """The Trainer's train dataloader, each batch split over the ``fsdp`` axis."""
        return self._shard_batches(super().get_train_dataloader())

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """The Trainer's eval dataloader, each batch split over the ``fsdp`` axis."""
        return self._shard_batches(super().get_eval_dataloader(eval_dataset))
