"""FSDPTrainer: the blog's fsdp_config.json, unchanged, trains a GPT-2 built from a config
(deferred init) through the Hugging Face Trainer on 8 devices; the saved model loads into a
plain GPT2LMHeadModel; bad setups raise errors that say what to change."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2LMHeadModel, TrainingArguments

import fsdp_xla
from fsdp_xla import FSDPTypeError
from fsdp_xla.hf import FSDPTrainer, HFConfigError
from mesh import MeshTypeError
from spmd import get_sharding
from tests.fsdp_xla.hf.models import gpt2_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
BLOG_JSON = EXAMPLES / "fsdp_config.json"


class Counting(torch.utils.data.Dataset):
    def __init__(self, n, seq=16, vocab=128):
        gen = torch.Generator().manual_seed(0)
        start = torch.randint(0, vocab, (n, 1), generator=gen)
        self.tokens = (start + torch.randint(1, 4, (n, 1), generator=gen) * torch.arange(seq)) % vocab

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def training_args(tmp_path, **overrides):
    base = dict(
        output_dir=str(tmp_path / "out"),
        fsdp=True,
        fsdp_config=str(BLOG_JSON),
        per_device_train_batch_size=16,
        max_steps=8,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_drop_last=True,
    )
    base.update(overrides)
    return TrainingArguments(**base)


@pytest.fixture(scope="module")
def trained(xla, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("trainer")
    model = fsdp_xla.deferred_init(AutoModelForCausalLM.from_config, gpt2_config())
    assert all(p.is_meta for p in model.parameters())
    trainer = FSDPTrainer(model=model, args=training_args(tmp_path), train_dataset=Counting(16 * 8))
    seen = []
    model.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(get_sharding(kwargs.get("input_ids", args[0] if args else None))),
        with_kwargs=True,
    )
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    return trainer, model, losses, seen, tmp_path


def test_blog_config_trains_gpt2_with_deferred_init(trained):
    trainer, model, losses, seen, _ = trained
    assert len(losses) == 8
    assert losses[-1] < 0.9 * losses[0]
    assert model.fsdp_units == ["", "transformer.h.0", "transformer.h.1"]
    assert all(p.device.type == "xla" for p in model.parameters())
    assert str(get_sharding(model.transformer.h[0].attn.c_attn.weight)) == "{devices=[8,1]0,1,2,3,4,5,6,7}"  # dim 0
    assert model.transformer.h[0]._fsdp_unit.checkpoint  # xla_fsdp_grad_ckpt
    assert model.transformer.h[0]._fsdp_unit.config.compute_dtype is torch.bfloat16
    assert str(seen[0]).startswith("{devices=[8,1]")  # the batch is split over the fsdp axis
    assert trainer.optimizer.param_groups[0]["params"][0].device.type == "xla"


def test_saved_model_loads_into_a_plain_gpt2(trained):
    trainer, model, _, _, tmp_path = trained
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    assert json.loads((out / "config.json").read_text())["architectures"] == ["GPT2LMHeadModel"]
    plain = GPT2LMHeadModel.from_pretrained(str(out))
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(v, state[k], msg=k)


def test_fsdp_must_be_on(xla, tmp_path):
    args = training_args(tmp_path, fsdp=None, fsdp_config=None)
    with pytest.raises(HFConfigError, match="FSDPTrainer needs FSDP turned on"):
        FSDPTrainer(model=GPT2LMHeadModel(gpt2_config()), args=args, train_dataset=Counting(32))


@pytest.mark.parametrize(
    ("overrides", "mesh", "says"),
    [
        (dict(fsdp_config={"min_num_params": 1000}), None, 'fsdp_config must hold "xla": true'),
        (dict(gradient_checkpointing=True), None, '"xla_fsdp_grad_ckpt": true in fsdp_config.json'),
        ({}, "data", "shards parameters over the axes named 'fsdp' and 'context', but mesh\\{'data': 8\\} has neither"),
    ],
)
def test_what_transformers_would_fail_on_obscurely_is_said_first(xla, tmp_path, overrides, mesh, says):
    import numpy as np

    from mesh import Mesh

    args = training_args(tmp_path, **overrides)
    the_mesh = Mesh(np.arange(8), (8,), (mesh,)) if mesh else None
    with pytest.raises(HFConfigError, match=says):
        FSDPTrainer(model=GPT2LMHeadModel(gpt2_config()), args=args, train_dataset=Counting(32), mesh=the_mesh)


@pytest.mark.parametrize(
    ("extra", "error", "says"),
    [
        (dict(mesh="fsdp"), MeshTypeError, r"FSDPTrainer\(mesh=\.\.\.\) expects a mesh.Mesh .* got builtins.str"),
        (dict(sharding_plan="x"), FSDPTypeError, r"sharding_plan=\.\.\.\) takes a spmd.logical_axes.ShardingPlan"),
    ],
)
def test_a_mesh_or_plan_of_the_wrong_type_is_named(xla, tmp_path, extra, error, says):
    model = GPT2LMHeadModel(gpt2_config())
    with pytest.raises(error, match=says):
        FSDPTrainer(model=model, args=training_args(tmp_path), train_dataset=Counting(32), **extra)
    assert not isinstance(model, fsdp_xla.FSDP)


def test_batch_must_divide_by_the_fsdp_axis(xla, tmp_path):
    args = training_args(tmp_path, per_device_train_batch_size=12)
    with pytest.raises(HFConfigError, match="per_device_train_batch_size=12 .* Use a multiple of 8"):
        FSDPTrainer(model=GPT2LMHeadModel(gpt2_config()), args=args, train_dataset=Counting(32))


def test_fused_adamw_default_is_replaced(xla, tmp_path):
    args = training_args(tmp_path, optim="adamw_torch_fused")
    trainer = FSDPTrainer(model=GPT2LMHeadModel(gpt2_config()), args=args, train_dataset=Counting(32))
    assert trainer.args.optim.value == "adamw_torch"


def test_our_training_arguments_name_the_bad_json_line(tmp_path):
    from fsdp_xla.hf import TrainingArguments as CheckedArguments

    bad = tmp_path / "fsdp_config.json"
    bad.write_text('{\n  "xla": true,\n  "xla_fsdp_grad_ckpt": true,\n}\n')
    with pytest.raises(json.JSONDecodeError):  # transformers' own: no file name
        TrainingArguments(output_dir=str(tmp_path), fsdp="full_shard", fsdp_config=str(bad), report_to=[])
    with pytest.raises(HFConfigError, match=r"fsdp_config.json, line 4, column 1: not valid JSON"):
        CheckedArguments(output_dir=str(tmp_path), fsdp="full_shard", fsdp_config=str(bad), report_to=[])
    bad.write_text(json.dumps({"xla": True, "transformer_layer_cls_to_warp": ["GPT2Block"]}))
    with pytest.raises(HFConfigError, match="did you mean 'transformer_layer_cls_to_wrap'"):
        CheckedArguments(output_dir=str(tmp_path), fsdp="full_shard", fsdp_config=str(bad), report_to=[])
    good = CheckedArguments(output_dir=str(tmp_path), fsdp="full_shard", fsdp_config=str(BLOG_JSON), report_to=[])
    assert isinstance(good, TrainingArguments) and good.fsdp_config["xla"] is True


@pytest.mark.parametrize(
    "config, said",
    [
        ({"xla": "no"}, r"fsdp_config 'xla' must be true or false, got 'no'"),
        ({"xla": True, "transformer_layer_cls_to_warp": ["GPT2Block"]}, "did you mean 'transformer_layer_cls_to_wrap'"),
        ({"xla": True, "min_num_params": -5}, r"'min_num_params' must be an integer >= 0, got -5"),
        ({"xla": True, "xla_fsdp_grad_ckpt": "yes"}, r"'xla_fsdp_grad_ckpt' must be true or false, got 'yes'"),
    ],
)
def test_a_dict_fsdp_config_is_checked_as_a_file_is(tmp_path, config, said):
    from fsdp_xla.hf import TrainingArguments as CheckedArguments

    with pytest.raises(HFConfigError, match=said):
        CheckedArguments(output_dir=str(tmp_path), fsdp="full_shard", fsdp_config=config, report_to=[])


def test_a_dict_fsdp_config_reaches_transformers_with_real_bools(tmp_path):
    from fsdp_xla.hf import TrainingArguments as CheckedArguments

    config = {"xla": "true", "xla_fsdp_grad_ckpt": "False", "transformer_layer_cls_to_wrap": ["GPT2Block"]}
    args = CheckedArguments(output_dir=str(tmp_path), fsdp="full_shard", fsdp_config=config, report_to=[])
    assert args.fsdp_config["xla"] is True and args.fsdp_config["xla_fsdp_grad_ckpt"] is False
    assert config["xla_fsdp_grad_ckpt"] == "False"  # the caller's dict is not changed


def test_every_batch_key_is_split_on_its_batch_dim_or_by_its_own_spec(xla):
    """pytorch/xla#5768: one 2-D spec used to leave 4-D masks, pixel_values and 1-D labels
    replicated; each key is now split on its batch dim over the data axes, or by its own spec."""
    import numpy as np
    import torch_xla.distributed.parallel_loader as pl

    from fsdp_xla.hf.trainer import batch_sharding
    from mesh import Mesh
    from spmd import P, get_sharding

    mesh = Mesh(np.arange(8), (4, 2), ("fsdp", "model"))
    batch = {
        "input_ids": torch.zeros(8, 16, dtype=torch.long),
        "attention_mask": torch.ones(8, 1, 16, 16),
        "labels": torch.zeros(8, dtype=torch.long),
        "pixel_values": torch.zeros(8, 3, 4, 4),
        "num_items": torch.tensor(8),
    }
    sharding = batch_sharding(mesh, {"pixel_values": P("fsdp", "model")})
    (sent,) = list(pl.MpDeviceLoader([batch], xla, input_sharding=sharding))
    on_batch_dim = "devices=[4,{}2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}}"
    assert str(get_sharding(sent["input_ids"])) == "{" + on_batch_dim.format("1,")
    assert str(get_sharding(sent["attention_mask"])) == "{" + on_batch_dim.format("1,1,1,")
    assert str(get_sharding(sent["labels"])) == "{" + on_batch_dim.format("")
    assert str(get_sharding(sent["pixel_values"])) == "{devices=[4,2,1,1]0,1,2,3,4,5,6,7}"
    assert get_sharding(sent["num_items"]) is None or get_sharding(sent["num_items"]).is_replicated  # 0-d
    with pytest.raises(HFConfigError, match="batch_specs must map batch keys to specs"):
        batch_sharding(mesh, [("fsdp",)])
