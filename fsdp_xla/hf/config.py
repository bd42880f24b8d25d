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

from fsdp_xla.errors import FSDPError, FSDPTypeError, WrapPolicyError
from fsdp_xla.hf.config_keys import IGNORED_KEYS, IGNORED_XLA_SETTINGS, MAPPED_KEYS, MAPPED_SETTINGS
from fsdp_xla.policies import MixedPrecision, SizeWrapPolicy, TransformerWrapPolicy, WrapPolicy
from mesh import Role
from mesh.checks import require_bool, require_int
from spmd.files import read_regular_file

__all__ = ["HFConfigError", "HFFSDPConfig", "read_fsdp_config", "IGNORED_KEYS", "IGNORED_XLA_SETTINGS"]


class HFConfigError(FSDPError):
    """An ``fsdp_config`` key that is unknown, of the wrong type, or cannot be honoured."""


_CALLABLE_SETTINGS = {"auto_wrap_policy", "auto_wrapper_callable", "param_init_fn"}
_OFF = (False, None, 0, "", "false", "False")
_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MAX_CONFIG_BYTES = 1 << 20  # an fsdp_config is a few hundred bytes


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

    return P(Role.FSDP.value) if param.dim() > 0 else P()


def _load(config: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if "\x00" in str(path):
            raise HFConfigError(f"fsdp_config path {str(config)[:200]!r} holds a NUL character; pass a file's path.")
        raw = read_regular_file(path, limit=_MAX_CONFIG_BYTES, what="fsdp_config file", error=HFConfigError)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise HFConfigError(
                f"fsdp_config file {path} is not UTF-8 text (byte {e.start}); pass the path of a JSON file or a dict."
            ) from None
        try:
            data = json.loads(text, object_pairs_hook=_refuse_repeated_keys)
        except HFConfigError as e:
            raise HFConfigError(f"fsdp_config file {path}: {e}") from None
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


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key given twice (``json`` would keep the last silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise HFConfigError(f"the key {key!r:.100} is given twice in one object; keep one.")
        out[key] = value
    return out


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
        config: the JSON file path (a regular file) or the dict (not modified).
        warn: emit one ``UserWarning`` per key that has no meaning on GSPMD.

    Raises:
        FSDPTypeError: ``warn`` is not a bool.
        HFConfigError: unknown key (or one given twice), wrong type, ``min_num_params`` together with
            ``transformer_layer_cls_to_wrap``, ``xla_fsdp_grad_ckpt`` without a wrap policy,
            a callable setting in JSON, or a path that is not a regular JSON file.
    """
    require_bool(warn, "read_fsdp_config: warn", FSDPTypeError)
    cfg = _normalized_keys(_load(config))
    ignored = _ignored_keys(cfg)
    layer_classes = _layer_classes(cfg)
    min_num_params = _min_num_params(cfg, layer_classes)
    wrap = _wrap(cfg, min_num_params)
    checkpointing = _bool("xla_fsdp_grad_ckpt", cfg.get("xla_fsdp_grad_ckpt", False))
    checkpointing = _bool("activation_checkpointing", cfg.get("activation_checkpointing", False)) or checkpointing
    if checkpointing and wrap == "none":
        raise HFConfigError(
            "fsdp_config 'xla_fsdp_grad_ckpt' checkpoints each nested unit, but auto_wrap_policy is NO_WRAP: there are "
            "none. Set transformer_layer_cls_to_wrap or min_num_params."
        )
    settings = _xla_settings(cfg, ignored)
    reshard = _bool("reshard_after_forward", cfg.get("reshard_after_forward", True))
    if "reshard_after_forward" in settings:
        reshard = _bool("xla_fsdp_settings.reshard_after_forward", settings["reshard_after_forward"])
    if warn:
        for key, why in ignored:
            warnings.warn(
                f"fsdp_config {key!r} has no meaning on GSPMD and is ignored: {why}.", UserWarning, stacklevel=2
            )
    return HFFSDPConfig(
        layer_classes=layer_classes,
        min_num_params=min_num_params,
        wrap=wrap,
        mixed_precision=_precision(settings),
        reshard_after_forward=reshard,
        gradient_checkpointing=checkpointing,
        optimization_barriers=_barriers(settings),
        sync_after_backward=_bool("sync_on_finalization", settings["sync_on_finalization"])
        if "sync_on_finalization" in settings
        else None,
        shard_param_on_dim_0=_bool("shard_param_on_dim_0", settings.get("shard_param_on_dim_0", False)),
        ignored=tuple(ignored),
    )


def _normalized_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """The keys without their ``fsdp_`` prefix, each given once, each one the Trainer knows."""
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
    known = MAPPED_KEYS | set(IGNORED_KEYS)
    unknown = sorted(set(cfg) - known)
    if unknown:
        hints = [
            f"{k!r} (did you mean {close[0]!r}?)" for k in unknown if (close := difflib.get_close_matches(k, known, 1))
        ]
        hint = f" Closest: {', '.join(hints)}." if hints else ""
        raise HFConfigError(f"fsdp_config has unknown key(s) {unknown}.{hint} The Trainer's keys are {sorted(known)}.")
    return cfg


def _ignored_keys(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """The keys that ask for something GSPMD has no use for, with why.

    A key left off (false, 0, empty) asks for nothing fsdp_xla would do differently; the Trainer
    itself fills some in (xla_fsdp_v2=false), so only keys that ask for something count.
    """
    ignored = [(k, IGNORED_KEYS[k]) for k in cfg if k in IGNORED_KEYS and cfg[k] not in _OFF]
    if "xla" in cfg and not _bool("xla", cfg["xla"]):
        ignored.append(("xla", "false selects CUDA FSDP in the Trainer; fsdp_xla always runs XLA FSDP"))
    return ignored


def _layer_classes(cfg: dict[str, Any]) -> tuple[str, ...] | None:
    layer_classes = cfg.get("transformer_layer_cls_to_wrap")
    if layer_classes is None:
        return None
    if isinstance(layer_classes, str):
        layer_classes = [c.strip() for c in layer_classes.split(",") if c.strip()]
    if not isinstance(layer_classes, list) or not all(isinstance(c, str) and c for c in layer_classes):
        raise HFConfigError(
            f"fsdp_config 'transformer_layer_cls_to_wrap' must be a list of class names, got {layer_classes!r:.200}."
        )
    if not layer_classes:
        raise HFConfigError(
            "fsdp_config 'transformer_layer_cls_to_wrap' names no class; give the model's block class "
            "(e.g. ['GPT2Block']), or leave the key out to use the model's _no_split_modules."
        )
    return tuple(layer_classes)


def _min_num_params(cfg: dict[str, Any], layer_classes: tuple[str, ...] | None) -> int:
    # a numpy int (in a dict config) is one too
    min_num_params = require_int(
        cfg.get("min_num_params", 0),
        "fsdp_config 'min_num_params'",
        HFConfigError,
        minimum=0,
        allowed="an integer >= 0",
    )
    if min_num_params > 0 and layer_classes:
        raise HFConfigError(
            "fsdp_config sets both 'min_num_params' and 'transformer_layer_cls_to_wrap'; they are mutually exclusive "
            "wrap policies. Keep transformer_layer_cls_to_wrap for transformer models (tied embeddings stay in one unit)."
        )
    return min_num_params


def _wrap(cfg: dict[str, Any], min_num_params: int) -> str:
    """The wrap policy: ``transformer``, ``size`` or ``none``."""
    wrap = "size" if min_num_params > 0 else "transformer"
    policy_name = cfg.get("auto_wrap_policy")
    if policy_name is None:
        return wrap
    if not isinstance(policy_name, str) or policy_name not in _WRAP_POLICIES:
        raise HFConfigError(
            f"fsdp_config 'auto_wrap_policy' must be one of {list(_WRAP_POLICIES)}, got {policy_name!r:.100}."
        )
    if policy_name == "NO_WRAP":
        return "none"
    if policy_name == "SIZE_BASED_WRAP":
        if min_num_params <= 0:
            raise HFConfigError("fsdp_config 'auto_wrap_policy' SIZE_BASED_WRAP needs 'min_num_params' > 0.")
        return "size"
    if min_num_params > 0:
        raise HFConfigError("fsdp_config 'auto_wrap_policy' TRANSFORMER_BASED_WRAP contradicts 'min_num_params' > 0.")
    return wrap


def _xla_settings(cfg: dict[str, Any], ignored: list[tuple[str, str]]) -> Mapping[str, Any]:
    """``xla_fsdp_settings``, each key checked; the ones GSPMD ignores are added to ``ignored``."""
    settings = cfg.get("xla_fsdp_settings", {})
    if not isinstance(settings, Mapping):
        raise HFConfigError(f"fsdp_config 'xla_fsdp_settings' must be an object, got {type(settings).__name__}.")
    allowed = MAPPED_SETTINGS | set(IGNORED_XLA_SETTINGS)
    for key in settings:
        if key in _CALLABLE_SETTINGS:
            raise HFConfigError(
                f"xla_fsdp_settings {key!r} takes a Python callable, which JSON cannot hold; use the fsdp_config "
                "keys transformer_layer_cls_to_wrap / min_num_params (or call fsdp_xla.FSDP directly)."
            )
        if key not in allowed:
            raise HFConfigError(
                f"xla_fsdp_settings has unknown key {key!r:.100}; torch_xla's XlaFullyShardedDataParallel settings are "
                f"{sorted(allowed | _CALLABLE_SETTINGS)}."
            )
        if key in IGNORED_XLA_SETTINGS and settings[key] not in _OFF:
            ignored.append((f"xla_fsdp_settings.{key}", IGNORED_XLA_SETTINGS[key]))
    return settings


def _precision(settings: Mapping[str, Any]) -> MixedPrecision | None:
    if not any(k in settings for k in ("compute_dtype", "buffer_dtype", "fp32_reduce_scatter")):
        return None
    compute = _dtype("compute_dtype", settings.get("compute_dtype", "float32"))
    buffer = _dtype("buffer_dtype", settings["buffer_dtype"]) if "buffer_dtype" in settings else None
    fp32_reduce = _bool("fp32_reduce_scatter", settings.get("fp32_reduce_scatter", False))
    return MixedPrecision(compute, buffer, torch.float32 if fp32_reduce else None)


def _barriers(settings: Mapping[str, Any]) -> bool:
    barrier_fwd = _bool("optimization_barrier_in_forward", settings.get("optimization_barrier_in_forward", True))
    barrier_bwd = _bool("optimization_barrier_in_backward", settings.get("optimization_barrier_in_backward", True))
    if barrier_fwd != barrier_bwd:
        raise HFConfigError(
            "xla_fsdp_settings turns only one of optimization_barrier_in_forward / optimization_barrier_in_backward "
            "off; fsdp_xla's barriers work as a pair (one keeps the forward gather, the other the backward one "
            "from being merged). Set both to the same value."
        )
    return barrier_fwd
