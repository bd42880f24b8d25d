"""Run under torchrun (4 ranks, gloo) by tests/fsdp_xla/hf/test_trainer_context.py: FSDPTrainer with
accelerate's ParallelismConfig on DTensor.

    torchrun --nproc_per_node 4 tests/workers/hf_context_worker.py OUT_DIR

A small transformers Llama (grouped-query attention, rotary positions) trains 10 steps in float32
three ways: ``dp_shard_size=4`` (no context parallelism), ``dp_shard_size=2, cp_size=2`` and
``cp_size=4``; then the configurations FSDPTrainer refuses. Rank 0 writes OUT_DIR/results.json.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import ParallelismConfig
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

from fsdp_xla.hf import FSDPTrainer

out = Path(sys.argv[1])
FSDP_CONFIG = {"xla": True, "fsdp_transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
SEQ, VOCAB, BATCH = 64, 128, 8


class Counting(torch.utils.data.Dataset):
    """Sequences counting up by a random stride mod the vocabulary: the loss must fall."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        start, stride = torch.randint(0, VOCAB, (n, 1), generator=g), torch.randint(1, 4, (n, 1), generator=g)
        self.tokens = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def trainer(parallelism: ParallelismConfig | None, tag: str, **kwargs: object) -> FSDPTrainer:
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=SEQ, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=str(out / tag), fsdp=True, fsdp_config=FSDP_CONFIG, per_device_train_batch_size=BATCH,
        max_steps=10, learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
        report_to=[], dataloader_drop_last=True, optim="adamw_torch", use_cpu=True,
        parallelism_config=parallelism,
    )  # fmt: skip
    return FSDPTrainer(model=LlamaForCausalLM(config), args=args, train_dataset=Counting(BATCH * 10), **kwargs)


def losses(parallelism: ParallelismConfig | None, tag: str) -> dict:
    t = trainer(parallelism, tag)
    t.train()
    return {
        "losses": [log["loss"] for log in t.state.log_history if "loss" in log],
        "mesh": t.fsdp_mesh.describe(),
        "attention": t.model.config._attn_implementation,
    }


def refusal(build) -> dict:
    try:
        build()
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}
    return {"error": None, "message": ""}


results = {
    "fsdp 4": losses(ParallelismConfig(dp_shard_size=4), "fsdp4"),
    "fsdp 2 x context 2": losses(ParallelismConfig(dp_shard_size=2, cp_size=2), "cp2"),
    "context 4": losses(ParallelismConfig(cp_size=4), "cp4"),
    "refused": {
        "sizes": refusal(lambda: trainer(ParallelismConfig(dp_shard_size=2, cp_size=4), "bad")),
        "sequence parallel": refusal(lambda: trainer(ParallelismConfig(dp_shard_size=2, sp_size=2), "bad")),
        "tensor parallel": refusal(lambda: trainer(ParallelismConfig(dp_shard_size=2, tp_size=2), "bad")),
    },
}
if dist.get_rank() == 0:
    (out / "results.json").write_text(json.dumps(results))
dist.destroy_process_group()
