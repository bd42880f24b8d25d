"""The Hugging Face Trainer's ``fsdp_config`` (JSON file or dict) read into fsdp_xla options.

Every key the Trainer documents is either mapped to an FSDP option or reported, by name, as
having no meaning on GSPMD (one warning per key, and listed in `HFFSDPConfig.ignored`).
Unknown keys, wrong types, both wrap policies at once, and settings that cannot be honoured
raise `HFConfigError` naming the key and what is allowed. Pure Python: transformers is not
imported here.
"""

from __future__ import annotations

import difflib
import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fsdp_xla.errors import FSDPError, WrapPolicyError
from fsdp_xla.policies import MixedPrecision, SizeWrapPolicy, TransformerWrapPolicy, WrapPolicy

__all__ = ["HFConfigError", "HFFSDPConfig", "read_fsdp_config", "IGNORED_KEYS", "IGNORED_XLA_SETTINGS"]


class HFConfigError(FSDPError):
    """An ``fsdp_config`` key that is unknown, of the wrong type, or cannot be honoured."""


# Top-level keys (after the Trainer strips the ``fsdp_`` prefix) that configure PyTorch's
# CUDA FSDP through accelerate and mean nothing for XLA FSDP on GSPMD.
IGNORED_KEYS: dict[str, str] = {
    "version": "selects torch FSDP1/FSDP2 on GPUs; fsdp_xla is one implementation",
    "cpu_offload": "offloads to CPU memory on GPUs; not supported on XLA devices",
    "cpu_ram_efficient_loading": "loads pretrained weights on rank 0 only; use fsdp_xla.deferred_init to build "
    "models larger than host memory",
    "state_dict_type": "torch FSDP state-dict mode; fsdp_xla keeps parameter names, and sharded checkpoints are "
    "fsdp_xla.checkpoint.save_sharded",
    "backward_prefetch": "CUDA stream prefetching; XLA schedules collectives itself",
    "forward_prefetch": "CUDA stream prefetching; XLA schedules collectives itself",
    "limit_all_gathers": "CUDA caching-allocator throttle; XLA plans memory at compile time",
    "use_orig_params": "fsdp_xla always keeps the original parameters",
    "sync_module_states": "GSPMD runs one program over all devices: there is nothing to broadcast",
    "xla_fsdp_v2": "fsdp_xla is built on GSPMD; there is no v1/v2 choice to make",
}

# Settings of torch_xla's XlaFullyShardedDataParallel (``xla_fsdp_settings``) that describe
# hand-written collectives or flattening, which GSPMD does not have.
IGNORED_XLA_SETTINGS: dict[str, str] = {
    "flatten_parameters": "GSPMD shards each parameter as it is; nothing is flattened",
    "execute_sharding_on_init": "fsdp_xla shards parameters when it wraps the model",
    "pin_layout_in_collective_ops": "GSPMD inserts the collectives and XLA chooses their layouts",
    "disable_reshard_on_root": "the root unit is resharded like the others (reshard_after_forward)",
    "sharding_groups": "the fsdp mesh axis defines the groups",
    "sharding_rank": "the fsdp mesh axis defines the groups",
    "sharding_world_size": "the fsdp mesh axis defines the groups",
    "reduce_scatter_bucket_size_mb": "XLA combines collectives itself",
    "coalesce_all_gather_ops": "XLA combines collectives itself",
    "_shard_size_multiple": "GSPMD pads shards itself",
    "_use_xla_patched_linear": "fsdp_xla regathers weights for backward through saved-tensor hooks",
    "_debug_dummy_forward_pass": "a torch_xla FSDP v1 debugging switch",
    "_debug_msg": "a torch_xla FSDP v1 debugging switch",
    "_debug_print": "a torch_xla FSDP v1 debugging switch",
    "_debug_dummy_all_gather_op": "a torch_xla FSDP v1 debugging switch",
    "_debug_dummy_all_reduce_op": "a torch_xla FSDP v1 debugging switch",
    "_debug_dummy_reduce_scatter_op": "a torch_xla FSDP v1 debugging switch",
    "_debug_dummy_optimization_barrier_op": "a torch_xla FSDP v1 debugging switch",
}

_MAPPED_KEYS = {
    "xla",
    "xla_fsdp_settings",
    "xla_fsdp_grad_ckpt",
    "transformer_layer_cls_to_wrap",
    "min_num_params",
    "auto_wrap_policy",
    "reshard_after_forward",
    "activation_checkpointing",
}
_MAPPED_SETTINGS = {
    "compute_dtype",
    "buffer_dtype",
    "fp32_reduce_scatter",
    "reshard_after_forward",
    "optimization_barrier_in_forward",
    "optimization_barrier_in_backward",
    "shard_param_on_dim_0",
    "sync_on_finalization",
}
_CALLABLE_SETTINGS = {"auto_wrap_policy", "auto_wrapper_callable", "param_init_fn"}
_OFF = (False, None, 0, "", "false", "False")
_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class HFFSDPConfig:
    """An ``fsdp_config`` read into fsdp_xla terms.

    Attributes:
        layer_classes: transformer layer class names to wrap (``None``: not given).
        min_num_params: size-based wrapping threshold (0: not used).
        wrap: ``"transformer"``, ``"size"`` or ``"none"``.
        mixed_precision: from ``compute_dtype`` / ``buffer_dtype`` / ``fp32_reduce_scatter``.
        reshard_after_forward: the FSDP option of that name.
        gradient_checkpointing: the FSDP option of that name.
        optimization_barriers: the FSDP option of that name.
        sync_after_backward: the FSDP option of that name (``None``: its default).
        shard_param_on_dim_0: store parameters sharded on dim 0.
        ignored: ``(key, why)`` for each given key that has no meaning here.
    """

    layer_classes: tuple[str, ...] | None = None
    min_num_params: int = 0
    wrap: str = "transformer"
    mixed_precision: MixedPrecision | None = None
    reshard_after_forward: bool = True
    gradient_checkpointing: bool = False
    optimization_barriers: bool = True
    sync_after_backward: bool | None = None
    shard_param_on_dim_0: bool = False
    ignored: tuple[tuple[str, str], ...] = field(default=())

    def wrap_policy(self, model: torch.nn.Module) -> WrapPolicy | None:
        """The wrap policy for ``model``: layer classes resolved by name (default: the model's
        ``_no_split_modules``, as the Trainer does).

        Raises:
            WrapPolicyError: a class name the model does not contain (the message lists its classes).
        """
        if self.wrap == "none":
            return None
        if self.wrap == "size":
            return SizeWrapPolicy(self.min_num_params)
        names = self.layer_classes
        if names is None:
            names = tuple(getattr(model, "_no_split_modules", None) or ())
            if not names:
                raise HFConfigError(
                    f"fsdp_config gives no transformer_layer_cls_to_wrap and {type(model).__name__} has no "
                    "_no_split_modules to default to. Set transformer_layer_cls_to_wrap (e.g. ['GPT2Block']) or "
                    "min_num_params."
                )
        by_name: dict[str, type[torch.nn.Module]] = {}
        for module in model.modules():
            by_name.setdefault(type(module).__name__, type(module))
        missing = [n for n in names if n not in by_name]
        if missing:
            raise WrapPolicyError(
                f"fsdp_config transformer_layer_cls_to_wrap names {missing}, which {type(model).__name__} does not "
                f"contain; its module classes are {sorted(by_name)}. Names are case-sensitive."
            )
        return TransformerWrapPolicy(frozenset(by_name[n] for n in names))

    def fsdp_kwargs(self, model: torch.nn.Module) -> dict[str, Any]:
        """Keyword arguments for `fsdp_xla.FSDP` (everything but the mesh)."""
        kwargs: dict[str, Any] = dict(
            auto_wrap_policy=self.wrap_policy(model),
            mixed_precision=self.mixed_precision,
            reshard_after_forward=self.reshard_after_forward,
            gradient_checkpointing=self.gradient_checkpointing,
            optimization_barriers=self.optimization_barriers,
            sync_after_backward=self.sync_after_backward,
        )
        if self.shard_param_on_dim_0:
            kwargs["param_spec_fn"] = dim0_spec_fn
        return kwargs


def dim0_spec_fn(name: str, param: torch.Tensor) -> Any:
    """``shard_param_on_dim_0``: the FSDP axis on dim 0 (scalars replicated)."""
    from spmd import P

    return P("fsdp") if param.dim() > 0 else P()


def _load(config: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as e:
            raise HFConfigError(
                f"fsdp_config file {path} does not exist; pass the path of a JSON file or a dict."
            ) from e
        except (OSError, ValueError) as e:  # a directory, no permission, a NUL in the path, not UTF-8
            raise HFConfigError(
                f"fsdp_config {str(config)!r:.200} cannot be read as a UTF-8 text file ({type(e).__name__}: {e}); "
                "pass the path of a JSON file or a dict."
            ) from e
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            line = e.doc.splitlines()[e.lineno - 1] if e.lineno <= len(e.doc.splitlines()) else ""
            raise HFConfigError(
                f"fsdp_config file {path}, line {e.lineno}, column {e.colno}: not valid JSON ({e.msg}).\n"
                f"    {line}\n    {' ' * (e.colno - 1)}^"
            ) from e
        except (ValueError, RecursionError) as e:  # an integer of > 4300 digits; nesting deeper than the stack
            raise HFConfigError(
                f"fsdp_config file {path} cannot be read: {type(e).__name__}: {str(e)[:200]}. An fsdp_config holds "
                "flat keys with short values; fix the file."
            ) from e
        if not isinstance(data, dict):
            raise HFConfigError(f"fsdp_config file {path} holds a {type(data).__name__}; it must be a JSON object.")
        return data
    raise HFConfigError(f"fsdp_config must be a path to a JSON file or a dict, got {type(config).__name__}.")


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise HFConfigError(f"fsdp_config {key!r} must be true or false, got {value!r} ({type(value).__name__}).")


def _dtype(key: str, value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype) and value in _DTYPES.values():
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        return _DTYPES[value.removeprefix("torch.")]
    raise HFConfigError(f"xla_fsdp_settings {key!r} must be one of {sorted(_DTYPES)}, got {value!r}.")


def read_fsdp_config(config: str | os.PathLike[str] | Mapping[str, Any], *, warn: bool = True) -> HFFSDPConfig:
    """Read a Trainer ``fsdp_config`` (path or dict, ``fsdp_``-prefixed keys or not).

    Args:
        config: the JSON file path or the dict (not modified).
        warn: emit one ``UserWarning`` per key that has no meaning on GSPMD.

    Raises:
        HFConfigError: unknown key, wrong type, ``min_num_params`` together with
            ``transformer_layer_cls_to_wrap``, ``xla_fsdp_grad_ckpt`` without a wrap policy,
            or a callable setting in JSON.
    """
    raw = _load(config)
    cfg: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise HFConfigError(
                f"fsdp_config keys must be strings, got {key!r} ({type(key).__name__}); the keys are the Trainer's "
                "option names, e.g. 'transformer_layer_cls_to_wrap'."
            )
        name = key[5:] if key.startswith("fsdp_") else key
        if name in cfg:
            raise HFConfigError(f"fsdp_config gives {name!r} twice (with and without the 'fsdp_' prefix); keep one.")
        cfg[name] = value
    known = _MAPPED_KEYS | set(IGNORED_KEYS)
    unknown = sorted(set(cfg) - known)
    if unknown:
        hints = [
            f"{k!r} (did you mean {close[0]!r}?)" for k in unknown if (close := difflib.get_close_matches(k, known, 1))
        ]
        hint = f" Closest: {', '.join(hints)}." if hints else ""
        raise HFConfigError(f"fsdp_config has unknown key(s) {unknown}.{hint} The Trainer's keys are {sorted(known)}.")

    # A key left off (false, 0, empty) asks for nothing fsdp_xla would do differently; the
    # Trainer itself fills some in (xla_fsdp_v2=false), so only keys that ask for something count.
    ignored: list[tuple[str, str]] = [(k, IGNORED_KEYS[k]) for k in cfg if k in IGNORED_KEYS and cfg[k] not in _OFF]
    if "xla" in cfg and not _bool("xla", cfg["xla"]):
        ignored.append(("xla", "false selects CUDA FSDP in the Trainer; fsdp_xla always runs XLA FSDP"))

    layer_classes = cfg.get("transformer_layer_cls_to_wrap")
    if layer_classes is not None:
        if isinstance(layer_classes, str):
            layer_classes = [c.strip() for c in layer_classes.split(",") if c.strip()]
        if not isinstance(layer_classes, list) or not all(isinstance(c, str) and c for c in layer_classes):
            raise HFConfigError(
                f"fsdp_config 'transformer_layer_cls_to_wrap' must be a list of class names, got {layer_classes!r}."
            )
        if not layer_classes:
            raise HFConfigError(
                "fsdp_config 'transformer_layer_cls_to_wrap' names no class; give the model's block class "
                "(e.g. ['GPT2Block']), or leave the key out to use the model's _no_split_modules."
            )
        layer_classes = tuple(layer_classes)
    min_num_params = cfg.get("min_num_params", 0)
    if isinstance(min_num_params, bool) or not isinstance(min_num_params, int) or min_num_params < 0:
        raise HFConfigError(f"fsdp_config 'min_num_params' must be an integer >= 0, got {min_num_params!r}.")
    if min_num_params > 0 and layer_classes:
        raise HFConfigError(
            "fsdp_config sets both 'min_num_params' and 'transformer_layer_cls_to_wrap'; they are mutually exclusive "
            "wrap policies. Keep transformer_layer_cls_to_wrap for transformer models (tied embeddings stay in one unit)."
        )
    wrap = "size" if min_num_params > 0 else "transformer"
    policy_name = cfg.get("auto_wrap_policy")
    if policy_name is not None:
        if policy_name not in _WRAP_POLICIES:
            raise HFConfigError(
                f"fsdp_config 'auto_wrap_policy' must be one of {list(_WRAP_POLICIES)}, got {policy_name!r}."
            )
        if policy_name == "NO_WRAP":
            wrap = "none"
        elif policy_name == "SIZE_BASED_WRAP":
            if min_num_params <= 0:
                raise HFConfigError("fsdp_config 'auto_wrap_policy' SIZE_BASED_WRAP needs 'min_num_params' > 0.")
            wrap = "size"
        elif min_num_params > 0:
            raise HFConfigError(
                "fsdp_config 'auto_wrap_policy' TRANSFORMER_BASED_WRAP contradicts 'min_num_params' > 0."
            )

    checkpointing = _bool("xla_fsdp_grad_ckpt", cfg.get("xla_fsdp_grad_ckpt", False))
    checkpointing = _bool("activation_checkpointing", cfg.get("activation_checkpointing", False)) or checkpointing
    if checkpointing and wrap == "none":
        raise HFConfigError(
            "fsdp_config 'xla_fsdp_grad_ckpt' checkpoints each nested unit, but auto_wrap_policy is NO_WRAP: there are "
            "none. Set transformer_layer_cls_to_wrap or min_num_params."
        )
    reshard = _bool("reshard_after_forward", cfg.get("reshard_after_forward", True))

    settings = cfg.get("xla_fsdp_settings", {})
    if not isinstance(settings, Mapping):
        raise HFConfigError(f"fsdp_config 'xla_fsdp_settings' must be an object, got {type(settings).__name__}.")
    allowed = _MAPPED_SETTINGS | set(IGNORED_XLA_SETTINGS)
    for key in settings:
        if key in _CALLABLE_SETTINGS:
            raise HFConfigError(
                f"xla_fsdp_settings {key!r} takes a Python callable, which JSON cannot hold; use the fsdp_config "
                "keys transformer_layer_cls_to_wrap / min_num_params (or call fsdp_xla.FSDP directly)."
            )
        if key not in allowed:
            raise HFConfigError(
                f"xla_fsdp_settings has unknown key {key!r}; torch_xla's XlaFullyShardedDataParallel settings are "
                f"{sorted(allowed | _CALLABLE_SETTINGS)}."
            )
        if key in IGNORED_XLA_SETTINGS and settings[key] not in _OFF:
            ignored.append((f"xla_fsdp_settings.{key}", IGNORED_XLA_SETTINGS[key]))

    precision = None
    if any(k in settings for k in ("compute_dtype", "buffer_dtype", "fp32_reduce_scatter")):
        compute = _dtype("compute_dtype", settings.get("compute_dtype", "float32"))
        buffer = _dtype("buffer_dtype", settings["buffer_dtype"]) if "buffer_dtype" in settings else None
        fp32_reduce = _bool("fp32_reduce_scatter", settings.get("fp32_reduce_scatter", False))
        precision = MixedPrecision(compute, buffer, torch.float32 if fp32_reduce else None)
    if "reshard_after_forward" in settings:
        reshard = _bool("xla_fsdp_settings.reshard_after_forward", settings["reshard_after_forward"])
    barrier_fwd = _bool("optimization_barrier_in_forward", settings.get("optimization_barrier_in_forward", True))
    barrier_bwd = _bool("optimization_barrier_in_backward", settings.get("optimization_barrier_in_backward", True))
    if barrier_fwd != barrier_bwd:
        raise HFConfigError(
            "xla_fsdp_settings turns only one of optimization_barrier_in_forward / optimization_barrier_in_backward "
            "off; fsdp_xla's barriers work as a pair (one keeps the forward gather, the other the backward one "
            "from being merged). Set both to the same value."
        )
    sync = None
    if "sync_on_finalization" in settings:
        sync = _bool("sync_on_finalization", settings["sync_on_finalization"])
    dim0 = _bool("shard_param_on_dim_0", settings.get("shard_param_on_dim_0", False))

    if warn:
        for key, why in ignored:
            warnings.warn(
                f"fsdp_config {key!r} has no meaning on GSPMD and is ignored: {why}.", UserWarning, stacklevel=2
            )
    return HFFSDPConfig(
        layer_classes=layer_classes,
        min_num_params=min_num_params,
        wrap=wrap,
        mixed_precision=precision,
        reshard_after_forward=reshard,
        gradient_checkpointing=checkpointing,
        optimization_barriers=barrier_fwd,
        sync_after_backward=sync,
        shard_param_on_dim_0=dim0,
        ignored=tuple(ignored),
    )
