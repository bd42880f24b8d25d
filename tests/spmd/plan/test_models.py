"""Models the planner builds: a bad config or factory is a ModelSpecError naming what to change,
before transformers or the factory fails inside."""

import json

import pytest

from spmd.plan.errors import ModelSpecError
from spmd.plan.request.models import build_meta_model, builtin_config

GPT2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 256, "n_positions": 64}
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
         "intermediate_size": 96, "vocab_size": 128}  # fmt: skip


@pytest.mark.parametrize(
    "config, says",
    [
        ({**GPT2, "n_layer": -1}, "'n_layer' must be a whole number from 1 to 2147483647, got -1"),
        ({**GPT2, "n_head": 2.0}, "'n_head' must be a whole number from 1 to 2147483647, got 2.0"),
        ({**GPT2, "vocab_size": True}, "'vocab_size' must be a whole number"),
        ({**GPT2, "n_embd": 65}, r"width \(65\) does not split into its 2 attention heads"),
        ({**LLAMA, "num_key_value_heads": 3}, "4 attention heads do not split into 3 key/value heads"),
        ({"model_type": "t5"}, "cannot build a causal LM from this config: Unrecognized configuration class"),
    ],
)
def test_bad_configs_are_refused_before_building(tmp_path, config, says):
    """n_layer=-1 planned a model with no layers (exit 0); n_embd=65 raised from inside transformers."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelSpecError, match=says):
        build_meta_model(str(path))


def test_a_good_config_builds():
    module, config = build_meta_model("gpt2")
    assert config.n_layer == 12 and all(p.device.type == "meta" for p in module.parameters())


def test_a_builtin_config_is_the_one_its_model_is_built_from():
    _, built = build_meta_model("llama3.1-8b")
    assert builtin_config("llama3.1-8b").to_dict() == built.to_dict()
    with pytest.raises(ModelSpecError, match="Unknown built-in model 'llama9'; known: "):
        builtin_config("llama9")


@pytest.mark.parametrize(
    "spec, says",
    [
        (":", "':' is not a factory name: give 'package.module:function'"),
        ("a b:c", "'a b:c' is not a factory name"),
        ("json:", "'json:' is not a factory name"),
        ("json:loads", r"The factory 'json:loads' needs arguments \(missing a required argument: 's'\)"),
        ("os.path:sep", "The factory 'os.path:sep' is a str, not a function"),
        ("os:getcwd", "The factory 'os:getcwd' returned str, not an nn.Module"),
        ("no_such_module_xyz:f", "Cannot import the factory 'no_such_module_xyz:f'"),
    ],
)
def test_bad_factories_are_named(spec, says):
    """':' raised ValueError('Empty module name') from importlib; json:loads a TypeError."""
    with pytest.raises(ModelSpecError, match=says):
        build_meta_model(spec)


def test_gpt3_175b_is_maxtexts_with_175b_parameters_and_no_dropout():
    # MaxText's gpt3-175b: width 12288, 96 layers of 96 heads, MLP 4 x the width, 50304-token
    # vocabulary tied to the output; enable_dropout false, which splash attention needs too
    module, config = build_meta_model("gpt3-175b")
    assert (config.n_embd, config.n_layer, config.n_head, config.vocab_size, config.n_positions) == (
        12288, 96, 96, 50304, 2048,
    )  # fmt: skip
    n = sum(p.numel() for p in module.parameters())
    assert abs(n / 175e9 - 1) < 0.005, n
    assert (config.attn_pdrop, config.resid_pdrop, config.embd_pdrop) == (0.0, 0.0, 0.0)
