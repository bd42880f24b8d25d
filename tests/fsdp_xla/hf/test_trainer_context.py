"""FSDPTrainer honours accelerate's ParallelismConfig on DTensor (4 gloo ranks, one torchrun job:
tests/workers/hf_context_worker.py): a transformers Llama trains with context parallelism (fsdp 2 x
context 2, and context 4) to the losses of the run without it, float32; what cannot run is
refused with the fix. (accelerate refuses the config outright on CPU processes.)"""

import json
import re

import pytest

from tests.torchrun import WORKERS, warm_launch

WORKER = WORKERS / "hf_context_worker.py"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_context")
    launch = warm_launch(WORKER, 4, str(out), timeout=900)
    assert launch.returncode == 0, launch.stderr[-4000:]
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("run", ["fsdp 2 x context 2", "context 4"])
def test_context_parallel_training_gives_the_losses_without_it(results, run):
    reference, losses = results["fsdp 4"]["losses"], results[run]["losses"]
    assert len(losses) == len(reference) == 10
    assert losses == pytest.approx(reference, rel=1e-5)
    assert losses[-1] < losses[0]
    assert results[run]["attention"] == "spmd_context_parallel"


def test_the_config_builds_the_mesh(results):
    assert results["fsdp 4"]["mesh"] == "mesh{'fsdp': 4}"
    assert results["fsdp 2 x context 2"]["mesh"] == "mesh{'fsdp': 2, 'context': 2}"
    assert results["context 4"]["mesh"] == "mesh{'context': 4}"


EXPECTED = {
    "sizes": r"dp_shard_size=2, cp_size=4, tp_size=1\) covers 8 devices, but there are 4\. Make the sizes multiply to 4",
    "sequence parallel": r"sp_size=2\) is DeepSpeed's sequence parallelism .* cp_size",
    "tensor parallel": r"tp_size=2\): on the dtensor backend FSDPTrainer .* sharding_plan",
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_what_cannot_run_is_refused_with_the_fix(results, case):
    refused = results["refused"][case]
    assert refused["error"] == "HFConfigError", refused
    assert re.search(EXPECTED[case], refused["message"]), refused["message"]


def _xla_trainer(parallelism, output_dir, steps, batch=8):
    """FSDPTrainer on GSPMD (8 devices) over a 2-layer transformers Llama and a counting dataset."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    from fsdp_xla.hf import FSDPTrainer

    class Counting(torch.utils.data.Dataset):
        def __init__(self, n):
            g = torch.Generator().manual_seed(0)
            start, stride = torch.randint(0, 128, (n, 1), generator=g), torch.randint(1, 4, (n, 1), generator=g)
            self.tokens = (start + stride * torch.arange(32)) % 128

        def __len__(self):
            return len(self.tokens)

        def __getitem__(self, i):
            return {"input_ids": self.tokens[i], "labels": self.tokens[i]}

    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=str(output_dir), fsdp=True,
        fsdp_config={"xla": True, "fsdp_transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
        per_device_train_batch_size=batch, max_steps=steps, learning_rate=1e-3, lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", report_to=[], dataloader_drop_last=True, optim="adamw_torch",
        parallelism_config=parallelism,
    )  # fmt: skip
    return FSDPTrainer(model=LlamaForCausalLM(config), args=args, train_dataset=Counting(40))


@pytest.mark.torch_xla
def test_on_torch_xla_the_config_trains_with_the_losses_without_context_parallelism(xla, tmp_path):
    """GSPMD, one process, 8 devices: dp_shard_size=4 x cp_size=2 against dp_shard_size=8."""
    from accelerate import ParallelismConfig

    def losses(parallelism, tag):
        trainer = _xla_trainer(parallelism, tmp_path / tag, 5)
        trainer.train()
        return [log["loss"] for log in trainer.state.log_history if "loss" in log], trainer.fsdp_mesh.describe()

    reference, mesh = losses(ParallelismConfig(dp_shard_size=8), "fsdp")
    assert mesh == "mesh{'fsdp': 8}"
    split, mesh = losses(ParallelismConfig(dp_shard_size=4, cp_size=2), "cp")
    assert mesh == "mesh{'fsdp': 4, 'context': 2}"
    assert split == pytest.approx(reference, rel=1e-5) and len(split) == 5


@pytest.mark.torch_xla
def test_on_torch_xla_the_step_never_gathers_the_logits_along_the_sequence(xla, tmp_path):
    """The Trainer's step under fsdp 4 x context 2, compiled by GSPMD: the loss keeps the logits'
    ``[rows, seq]`` split (transformers' loss flattens them, and GSPMD then gathered the whole
    ``[rows, seq, vocab]`` logits over the context axis every step). What is gathered over the
    context axis outside attention is the embedding's ids and, in backward, its gradient."""
    from accelerate import ParallelismConfig

    from spmd.inspector import CollectiveKind, capture

    # a batch no other test compiles: torch_xla reuses a graph compiled before, and captures none
    trainer = _xla_trainer(ParallelismConfig(dp_shard_size=4, cp_size=2), tmp_path, 2, batch=16)
    with capture() as report:
        trainer.train()
    steps = [g for g in report.graphs if any(c.group_size == 2 for c in g.collectives)]
    assert steps, [g.name for g in report.graphs]
    vocab = 128
    for step in steps:
        gathers = [
            c
            for c in step.collectives
            if c.group_size == 2 and c.kind is CollectiveKind.ALL_GATHER and ".self_attn" not in c.op_name
        ]
        logits = [(c.op_name, c.arrays) for c in gathers if any(a.dims[-1:] == (vocab,) for a in c.arrays)]
        assert not logits
        assert len(gathers) <= 2, [(c.op_name, c.arrays) for c in gathers]
