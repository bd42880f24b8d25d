"""Models the planner builds on the meta device: built-in configs, a Hugging Face config.json,
or a ``module:function`` factory.

Built-in configs are the published shapes (Hugging Face configs of ``gpt2`` ... ``gpt2-xl``,
``meta-llama/Llama-2-7b-hf`` / 13b / 70b, ``meta-llama/Meta-Llama-3-8B`` / 70B,
``meta-llama/Llama-3.1-8B`` / 70B / 405B) and MaxText's ``global_parameter_scale`` models (``maxtext-16b`` ...
``maxtext-256b``, the shapes of its published v5e and v5p runs), written out so no hub download is needed. Parameters live on ``meta``; buffers are real (rotary tables are
computed from the config), so a 70 B model costs this machine nothing but its Python objects.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mesh.checks import is_int
from spmd._util.held_stderr import held_stderr
from spmd._util.regular_file import read_regular_file
from spmd.plan.errors import ModelSpecError, PlanError

__all__ = [
    "BUILTIN_CONFIGS",
    "DEFAULT_SEQ_LEN",
    "MAX_SEQ_LEN",
    "ModelSpecError",
    "build_meta_model",
    "builtin_config",
    "default_seq_len",
    "parameters_on_meta",
    "resolve_seq_len",
]

_MAX_CONFIG_BYTES = 16 * 2**20  # a Hugging Face config.json is a few KiB


def _gpt2(n_layer: int, n_embd: int, n_head: int, vocab: int = 50257, positions: int = 1024) -> dict[str, Any]:
    return {
        "model_type": "gpt2",
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_head": n_head,
        "vocab_size": vocab,
        "n_positions": positions,
    }


def _llama(
    d: int, layers: int, heads: int, kv: int, ff: int, vocab: int, ctx: int, theta: float = 10000.0
) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "hidden_size": d,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": ff,
        "vocab_size": vocab,
        "max_position_embeddings": ctx,
        "rope_theta": theta,
        "rms_norm_eps": 1e-5,
    }


def _llama31(d: int, layers: int, heads: int, ff: int) -> dict[str, Any]:
    """Llama 3.1: 8 K/V heads, a 128256-token vocabulary, 128K context by the llama3 rope scaling."""
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    return {**_llama(d, layers, heads, 8, ff, 128256, 131072, 500000.0), "rope_scaling": rope}


def _mistral(d: int, layers: int, heads: int, kv: int, ff: int) -> dict[str, Any]:
    """Mistral 7B as MaxText's ``mistral-7b.yml`` and Mistral's v0.2 and later checkpoints: no
    sliding window (Hugging Face's config defaults to v0.1's 4,096, so it is set to none)."""
    return {
        **_llama(d, layers, heads, kv, ff, 32000, 32768, 1000000.0),
        "model_type": "mistral",
        "sliding_window": None,
    }


def _maxtext(scale: int) -> dict[str, Any]:
    """MaxText's ``global_parameter_scale`` models (``MaxText/configs/base.yml``, ``pyconfig.py``
    ``get_individual_scales``): a Llama-2 decoder of width 2048, 16 heads of 128 (no grouped K/V),
    MLP 7168, 16 layers and a 32000-token vocabulary, its dims doubled in turn as the scale doubles
    (heads and MLP, then width, then layers). The head width stays 128, so heads x 128 can differ
    from the width (16B: width 4096, 64 heads)."""
    base, rem = divmod(scale.bit_length() - 1, 3)
    heads = 16 * 2 ** (base + (rem > 0))
    config = _llama(2048 * 2 ** (base + (rem > 1)), 16 * 2**base, heads, heads, 7168 * heads // 16, 32000, 2048)
    return {**config, "head_dim": 128}


def _gemma3(d: int, layers: int, heads: int, kv: int, head_dim: int, ff: int) -> dict[str, Any]:
    """Gemma 3's text model: five sliding-window layers of 1,024 tokens then one global layer,
    MaxText's 262,144-token vocabulary (Hugging Face pads it to 262,208), tied embeddings."""
    return {
        "model_type": "gemma3_text",
        "hidden_size": d,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": ff,
        "vocab_size": 262144,
        "sliding_window": 1024,
        "max_position_embeddings": 131072,
        "query_pre_attn_scalar": head_dim,
        "tie_word_embeddings": True,
    }


BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": _gpt2(12, 768, 12),
    "gpt2-medium": _gpt2(24, 1024, 16),
    "gpt2-large": _gpt2(36, 1280, 20),
    "gpt2-xl": _gpt2(48, 1600, 25),
    # MaxText's gpt3-175b (configs/models/gpt3-175b.yml): GPT-2's block at width 12288, 96 heads of
    # 128, MLP 49152, 96 layers, its 50304-token vocabulary tied to the output, 2048 positions, no
    # dropout (MaxText's enable_dropout: false)
    "gpt3-175b": {
        **_gpt2(96, 12288, 96, vocab=50304, positions=2048),
        "attn_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
    },
    "llama2-7b": _llama(4096, 32, 32, 32, 11008, 32000, 4096),
    "llama2-13b": _llama(5120, 40, 40, 40, 13824, 32000, 4096),
    "llama2-70b": _llama(8192, 80, 64, 8, 28672, 32000, 4096),
    "llama3-8b": _llama(4096, 32, 32, 8, 14336, 128256, 8192, 500000.0),
    "llama3-70b": _llama(8192, 80, 64, 8, 28672, 128256, 8192, 500000.0),
    "llama3.1-8b": _llama31(4096, 32, 32, 14336),
    "llama3.1-70b": _llama31(8192, 80, 64, 28672),
    "llama3.1-405b": _llama31(16384, 126, 128, 53248),
    "gemma3-12b": _gemma3(3840, 48, 16, 8, 256, 15360),
    "mistral-7b": _mistral(4096, 32, 32, 8, 14336),
    "maxtext-16b": _maxtext(16),
    "maxtext-32b": _maxtext(32),
    "maxtext-64b": _maxtext(64),
    "maxtext-128b": _maxtext(128),
    "maxtext-256b": _maxtext(256),
}


def _hf_config(config: dict[str, Any]) -> Any:
    import transformers

    # a deep copy: transformers writes into nested values (it adds rope_theta to Llama 3.1's
    # rope_scaling), and the built-in configs key the compile cache (`spmd.plan.advisor.plan_cache.model_key`):
    # a second plan of the same model in one process missed the first's cache entries
    config = copy.deepcopy(config)
    model_type = config.pop("model_type", None)
    if not model_type:
        raise ModelSpecError("The config has no 'model_type'; the planner builds Hugging Face causal LMs from it.")
    _check_sizes(config)
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **config)
    except ValueError as e:  # transformers' "Unrecognized model identifier: ..." and bad values
        raise ModelSpecError(
            f"transformers cannot build a config of model_type {model_type!r}: {str(e)[:300]}. The planner builds "
            "Hugging Face causal LMs (gpt2, llama, mistral, qwen2, ...); fix 'model_type', or pass a "
            "'package.module:function' factory."
        ) from None
    _check_heads(hf_config)
    return hf_config


# Sizes of the Hugging Face causal LMs (GPT-2's names and Llama's): transformers accepts
# n_layer=-1 (and builds a model with no layers) or a float, so the planner checks them.
_SIZE_FIELDS = (
    "n_layer", "n_embd", "n_head", "n_inner", "n_positions", "vocab_size", "hidden_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "intermediate_size", "max_position_embeddings", "head_dim",
)  # fmt: skip
_MAX_SIZE = 2**31 - 1  # XLA indexes a dimension with int32 at most


def _check_sizes(config: dict[str, Any]) -> None:
    """Every size the config gives is a whole number from 1 to 2**31 - 1."""
    for key in _SIZE_FIELDS:
        value = config.get(key)
        if value is None:
            continue
        if not is_int(value) or not 1 <= value <= _MAX_SIZE:
            raise ModelSpecError(
                f"The config's {key!r} must be a whole number from 1 to {_MAX_SIZE}, got {value!r:.60}."
            )


def _check_heads(config: Any) -> None:
    """The attention heads split the width (unless ``head_dim`` is given) and the K/V heads
    split the query heads, as the model's attention layers require."""
    width, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None)
    if not isinstance(width, int) or not isinstance(heads, int) or heads < 1:
        return
    if not getattr(config, "head_dim", None) and width % heads:
        raise ModelSpecError(
            f"The config's width ({width}) does not split into its {heads} attention heads; give a width that is "
            f"a multiple of the head count (e.g. {width - width % heads or heads}), or another head count."
        )
    if isinstance(kv_heads, int) and kv_heads >= 1 and heads % kv_heads:
        raise ModelSpecError(
            f"The config's {heads} attention heads do not split into {kv_heads} key/value heads; give a "
            "num_key_value_heads that divides num_attention_heads."
        )


def builtin_config(name: str) -> Any:
    """The Hugging Face config of the built-in model ``name`` (`BUILTIN_CONFIGS`), no model built.

    Raises:
        ModelSpecError: ``name`` is not a built-in model.
    """
    if name not in BUILTIN_CONFIGS:
        raise ModelSpecError(f"Unknown built-in model {name!r:.80}; known: {sorted(BUILTIN_CONFIGS)}.")
    return _hf_config(BUILTIN_CONFIGS[name])


def build_meta_model(model: str | Path | torch.nn.Module) -> tuple[torch.nn.Module, Any]:
    """``(module with parameters on meta, its Hugging Face config or None)``.

    ``model`` is a built-in name (`BUILTIN_CONFIGS`), a path to a Hugging Face ``config.json``, a
    ``package.module:function`` factory returning an ``nn.Module`` (called under
    `parameters_on_meta`), or a module already on ``meta``.

    Raises:
        ModelSpecError: an unknown name, an unreadable config, a factory that is not found or does
            not return a module, or a module with parameters off ``meta``.
    """
    if isinstance(model, torch.nn.Module):
        module, config = model, getattr(model, "config", None)
    elif isinstance(model, str) and model in BUILTIN_CONFIGS:
        module, config = _from_config(_hf_config(BUILTIN_CONFIGS[model]))
    elif isinstance(model, (str, Path)) and str(model).endswith(".json"):
        text = read_regular_file(model, limit=_MAX_CONFIG_BYTES, what="a model's config.json", error=ModelSpecError)
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ModelSpecError(f"Cannot read the config {str(model)[:200]!r}: {e}") from e
        if not isinstance(data, dict):
            raise ModelSpecError(f"{str(model)!r} is not a JSON object.")
        module, config = _from_config(_hf_config(data))
    elif isinstance(model, str) and ":" in model:
        module, config = _from_factory(model), None
    else:
        raise ModelSpecError(
            f"Unknown model {model!r}: give a built-in name {sorted(BUILTIN_CONFIGS)}, a config.json path, "
            "or a 'package.module:function' factory returning an nn.Module."
        )
    off_meta = [n for n, p in module.named_parameters() if p.device.type != "meta"]
    if off_meta:
        raise ModelSpecError(
            f"Parameters {off_meta[:3]} are not on the meta device; build the model under torch.device('meta') "
            "so the planner never allocates it."
        )
    return module, config


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside goes to ``meta`` as it is registered; buffers stay on
    the CPU (rotary tables need values). A layer's ``reset_parameters`` then runs on ``meta``,
    so no weight is ever initialized: the host holds one empty tensor at a time at most."""
    register = torch.nn.Module.register_parameter

    def to_meta(self: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(self, name, param)

    torch.nn.Module.register_parameter = to_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _from_config(config: Any) -> tuple[torch.nn.Module, Any]:
    import transformers

    try:
        # held: the model classes import accelerate, which imports torch_xla where it is installed,
        # and torch_xla logs "Defaulting to PJRT_DEVICE=CPU" (shown if building fails)
        with held_stderr(), parameters_on_meta():
            module = transformers.AutoModelForCausalLM.from_config(config)
    except ValueError as e:  # a model type with no causal LM, a value its layers refuse
        raise ModelSpecError(f"transformers cannot build a causal LM from this config: {str(e)[:300]}") from e
    if getattr(module, "loss_type", "") is None:
        # A class whose name names no loss (GPT2LMHeadModel) gets loss_type None, and its first loss
        # warns "`loss_type=None` was set in the config but it is unrecognized" before falling back
        # to ForCausalLM: the loss a causal LM from AutoModelForCausalLM has. Name it outright.
        module.loss_type = "ForCausalLM"
    return module, config


def _from_factory(spec: str) -> torch.nn.Module:
    module_name, _, func_name = spec.partition(":")
    if not all(part.isidentifier() for part in module_name.split(".")) or not func_name.isidentifier():
        raise ModelSpecError(
            f"{spec[:200]!r} is not a factory name: give 'package.module:function' (a function taking no arguments "
            "that returns an nn.Module)."
        )
    try:
        factory = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise ModelSpecError(f"Cannot import the factory {spec!r}: {e}") from e
    _check_callable_without_arguments(spec, factory)
    with parameters_on_meta():
        module = factory()
    if not isinstance(module, torch.nn.Module):
        raise ModelSpecError(f"The factory {spec!r} returned {type(module).__name__}, not an nn.Module.")
    return module


def _check_callable_without_arguments(spec: str, factory: Any) -> None:
    if not callable(factory):
        raise ModelSpecError(f"The factory {spec!r} is a {type(factory).__name__}, not a function.")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: call it and see
        return
    try:
        signature.bind()
    except TypeError as e:
        raise ModelSpecError(
            f"The factory {spec!r} needs arguments ({e}); the planner calls it with none. Wrap it in a function "
            "that takes no arguments and returns the nn.Module."
        ) from None


DEFAULT_SEQ_LEN = 2048
MAX_SEQ_LEN = 2**24  # 16 M tokens; the step's position ids are built on the host (10**12 asked for 3.6 TiB)


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
        PlanError: not an int from 2 to `MAX_SEQ_LEN`, or longer than a learned position table, which the torch model
            could not run.
    """
    if seq_len is None:
        return default_seq_len(hf_config)
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or not 2 <= seq_len <= MAX_SEQ_LEN:
        raise PlanError(f"seq_len must be an int from 2 to {MAX_SEQ_LEN} (tokens per sequence), got {seq_len!r:.60}.")
    limit = _position_table(hf_config)
    if limit is not None and seq_len > limit:
        raise PlanError(
            f"seq_len={seq_len} is longer than the model's learned position table (n_positions={limit}): the model "
            f"cannot run it. Give --seq {limit} or less (seq_len={limit}), or a config with a larger n_positions."
        )
    return seq_len
