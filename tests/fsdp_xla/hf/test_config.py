"""The Trainer's fsdp_config read into fsdp_xla options: every documented key is mapped or
reported by name; bad input raises an error naming the key and what is allowed."""

import json
import warnings
from pathlib import Path

import pytest
import torch

from fsdp_xla import MixedPrecision, SizeWrapPolicy, TransformerWrapPolicy, WrapPolicyError
from fsdp_xla.hf import IGNORED_KEYS, IGNORED_XLA_SETTINGS, HFConfigError, read_fsdp_config
from fsdp_xla.hf.config import dim0_spec_fn
from spmd import P
from tests.fsdp_xla.hf.models import gpt2

BLOG_JSON = Path(__file__).resolve().parents[3] / "examples" / "fsdp_config.json"

# torch_xla 2.9's XlaFullyShardedDataParallel keyword arguments (the keys HF passes from
# xla_fsdp_settings), and the Trainer's documented fsdp_config keys (4.57 and 5.23).
XLA_FSDP_V1_ARGS = {
    "reshard_after_forward", "flatten_parameters", "execute_sharding_on_init", "optimization_barrier_in_forward",
    "optimization_barrier_in_backward", "sync_on_finalization", "disable_reshard_on_root", "compute_dtype",
    "buffer_dtype", "fp32_reduce_scatter", "sharding_groups", "sharding_rank", "sharding_world_size",
    "shard_param_on_dim_0", "pin_layout_in_collective_ops", "reduce_scatter_bucket_size_mb", "coalesce_all_gather_ops",
    "auto_wrap_policy", "auto_wrapper_callable", "param_init_fn", "_shard_size_multiple", "_use_xla_patched_linear",
    "_debug_dummy_forward_pass", "_debug_msg", "_debug_print", "_debug_dummy_all_gather_op",
    "_debug_dummy_all_reduce_op", "_debug_dummy_reduce_scatter_op", "_debug_dummy_optimization_barrier_op",
}  # fmt: skip
HF_KEYS = {
    "min_num_params", "transformer_layer_cls_to_wrap", "backward_prefetch", "forward_prefetch", "limit_all_gathers",
    "use_orig_params", "sync_module_states", "cpu_ram_efficient_loading", "activation_checkpointing", "xla",
    "xla_fsdp_v2", "xla_fsdp_settings", "xla_fsdp_grad_ckpt", "version", "reshard_after_forward", "cpu_offload",
    "state_dict_type", "auto_wrap_policy",
}  # fmt: skip


def test_the_blog_json_unchanged():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = read_fsdp_config(BLOG_JSON)
    assert cfg.layer_classes == ("GPT2Block",)
    assert cfg.wrap == "transformer"
    assert cfg.mixed_precision == MixedPrecision(torch.bfloat16)
    assert cfg.gradient_checkpointing
    assert cfg.shard_param_on_dim_0
    assert [k for k, _ in cfg.ignored] == ["xla_fsdp_settings.pin_layout_in_collective_ops"]
    assert [str(w.message).split(" has")[0] for w in caught] == [
        "fsdp_config 'xla_fsdp_settings.pin_layout_in_collective_ops'"
    ]
    model = gpt2()
    kwargs = cfg.fsdp_kwargs(model)
    (block_cls,) = kwargs["auto_wrap_policy"].layer_classes
    assert block_cls.__name__ == "GPT2Block"
    assert kwargs["param_spec_fn"] is dim0_spec_fn and dim0_spec_fn("w", torch.ones(3, 4)) == P("fsdp")


def test_every_documented_key_is_mapped_or_reported():
    settings = {k: True for k in XLA_FSDP_V1_ARGS - {"auto_wrap_policy", "auto_wrapper_callable", "param_init_fn"}}
    settings.update(compute_dtype="bfloat16", buffer_dtype="float32", reduce_scatter_bucket_size_mb=25, _debug_msg="x")
    settings.update(sharding_groups=[[0, 1]], sharding_rank=1, sharding_world_size=2, _shard_size_multiple=128)
    config = {k: True for k in HF_KEYS - {"min_num_params", "auto_wrap_policy", "version", "state_dict_type"}}
    config.update(
        transformer_layer_cls_to_wrap=["GPT2Block"],
        xla_fsdp_settings=settings,
        version=2,
        state_dict_type="SHARDED_STATE_DICT",
        backward_prefetch="BACKWARD_PRE",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = read_fsdp_config({f"fsdp_{k}": v for k, v in config.items()})  # the fsdp_ prefix is accepted
    reported = {k for k, _ in cfg.ignored}
    assert reported == (set(IGNORED_KEYS) & set(config)) | {f"xla_fsdp_settings.{k}" for k in IGNORED_XLA_SETTINGS}
    assert cfg.reshard_after_forward and cfg.optimization_barriers and cfg.sync_after_backward
    assert cfg.mixed_precision == MixedPrecision(torch.bfloat16, torch.float32, torch.float32)
    assert all(why for _, why in cfg.ignored)
    # and the sets above cover every key documented upstream
    assert set(IGNORED_XLA_SETTINGS) | {
        "compute_dtype", "buffer_dtype", "fp32_reduce_scatter", "reshard_after_forward",
        "optimization_barrier_in_forward", "optimization_barrier_in_backward", "shard_param_on_dim_0",
        "sync_on_finalization", "auto_wrap_policy", "auto_wrapper_callable", "param_init_fn",
    } == XLA_FSDP_V1_ARGS  # fmt: skip


def test_size_policy_and_no_wrap():
    cfg = read_fsdp_config({"min_num_params": 1000, "xla": True})
    assert cfg.wrap_policy(gpt2()) == SizeWrapPolicy(1000)
    assert read_fsdp_config({"auto_wrap_policy": "NO_WRAP", "xla": True}).wrap_policy(gpt2()) is None
    default = read_fsdp_config({"xla": True}).wrap_policy(gpt2())  # the model's _no_split_modules
    assert isinstance(default, TransformerWrapPolicy)
    assert [c.__name__ for c in default.layer_classes] == ["GPT2Block"]


@pytest.mark.parametrize(
    "config, message",
    [
        ({"xla": True, "shard_everything": True}, r"unknown key\(s\) \['shard_everything'\]"),
        ({"transformer_layer_cls_to_warp": ["Block"]}, r"did you mean 'transformer_layer_cls_to_wrap'\?"),
        ({"xla": "yes"}, r"'xla' must be true or false, got 'yes'"),
        ({"min_num_params": "1e8"}, r"'min_num_params' must be an integer >= 0, got '1e8'"),
        ({"min_num_params": 10, "transformer_layer_cls_to_wrap": ["GPT2Block"]}, "mutually exclusive"),
        ({"transformer_layer_cls_to_wrap": [3]}, "must be a list of class names"),
        ({"auto_wrap_policy": "BLOCKS"}, r"must be one of \['TRANSFORMER_BASED_WRAP'"),
        ({"auto_wrap_policy": "NO_WRAP", "xla_fsdp_grad_ckpt": True}, "checkpoints each nested unit"),
        ({"xla_fsdp_settings": {"compute_dtype": "bf16"}}, r"'compute_dtype' must be one of \['bfloat16'"),
        ({"xla_fsdp_settings": {"flaten_parameters": True}}, r"unknown key 'flaten_parameters'"),
        ({"xla_fsdp_settings": {"param_init_fn": "f"}}, "takes a Python callable"),
        ({"xla_fsdp_settings": {"optimization_barrier_in_forward": False}}, "work as a pair"),
        ({"xla_fsdp_settings": []}, "'xla_fsdp_settings' must be an object"),
        ({"xla": True, "fsdp_xla": True}, "gives 'xla' twice"),
        ("/nonexistent/fsdp_config.json", "does not exist"),
        (42, "must be a path to a JSON file or a dict"),
    ],
)
def test_bad_configs_name_the_key(config, message):
    with pytest.raises(HFConfigError, match=message):
        read_fsdp_config(config, warn=False)


def test_layer_class_absent_from_the_model():
    cfg = read_fsdp_config({"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
    with pytest.raises(WrapPolicyError, match=r"names \['LlamaDecoderLayer'\], which GPT2LMHeadModel does not contain"):
        cfg.wrap_policy(gpt2())


def test_json_file_errors(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text('{\n  "xla": true,\n  "min_num_params": 1e8,,\n}')
    with pytest.raises(HFConfigError, match=r"c.json, line 3, column 25: not valid JSON") as err:
        read_fsdp_config(bad)
    assert '"min_num_params": 1e8,,' in str(err.value)
    bad.write_text(json.dumps([1]))
    with pytest.raises(HFConfigError, match="holds a list"):
        read_fsdp_config(bad)


@pytest.mark.parametrize(
    "text, key",
    [
        ('{"min_num_params": 0, "min_num_params": 1000}', "min_num_params"),
        ('{"xla_fsdp_settings": {"compute_dtype": "bfloat16", "compute_dtype": "float32"}}', "compute_dtype"),
    ],
)
def test_a_key_given_twice_in_a_json_file_is_refused(tmp_path, text, key):
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(HFConfigError, match=rf"c.json: the key '{key}' is given twice in one object; keep one"):
        read_fsdp_config(path)


def test_numpy_ints_are_ints_and_warn_is_a_bool():
    import numpy as np

    from fsdp_xla import FSDPTypeError

    cfg = read_fsdp_config({"min_num_params": np.int64(100)})
    assert cfg.min_num_params == 100 and type(cfg.min_num_params) is int and cfg.wrap == "size"
    for warn in ("no", 0, None):
        with pytest.raises(FSDPTypeError, match=r"warn must be True or False, got"):
            read_fsdp_config({}, warn=warn)


def test_the_callers_dict_is_not_modified():
    config = {"fsdp_transformer_layer_cls_to_wrap": "GPT2Block", "xla": True}
    read_fsdp_config(config)
    assert config == {"fsdp_transformer_layer_cls_to_wrap": "GPT2Block", "xla": True}


def test_a_config_path_that_is_not_a_regular_file_is_refused_without_reading(tmp_path):
    import os
    import time

    fifo = tmp_path / "fsdp_config.json"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    started = time.monotonic()
    with pytest.raises(HFConfigError, match="fsdp_config file .* is a FIFO; it must be a regular file"):
        read_fsdp_config(fifo)
    assert time.monotonic() - started < 5
    with pytest.raises(HFConfigError, match="is a directory; it must be a regular file"):
        read_fsdp_config(tmp_path)
    with pytest.raises(HFConfigError, match="does not exist"):
        read_fsdp_config(tmp_path / "missing.json")
