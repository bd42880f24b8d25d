"""Hugging Face integration: the Trainer's ``fsdp_config`` JSON, `FSDPTrainer` (on torch_xla's
GSPMD, or on DTensor under torchrun), and 2-D sharding plans for GPT-2 and Llama.

``FSDPTrainer`` and ``TrainingArguments`` need transformers (``pip install 'xla-spmd[hf]'``);
they are imported on first use, so reading a config works without it.
"""

from typing import Any

from fsdp_xla.hf.config import IGNORED_KEYS, IGNORED_XLA_SETTINGS, HFConfigError, HFFSDPConfig, read_fsdp_config
from fsdp_xla.hf.plans import DEFAULT_AXIS_RULES, gpt2_plan, llama_plan

__all__ = [
    "DEFAULT_AXIS_RULES",
    "FSDPTrainer",
    "HFConfigError",
    "HFFSDPConfig",
    "IGNORED_KEYS",
    "IGNORED_XLA_SETTINGS",
    "TrainingArguments",
    "gpt2_plan",
    "llama_plan",
    "read_fsdp_config",
]


def __getattr__(name: str) -> Any:
    if name == "FSDPTrainer":
        from fsdp_xla.hf.trainer import FSDPTrainer

        return FSDPTrainer
    if name == "TrainingArguments":
        from fsdp_xla.hf.arguments import TrainingArguments

        return TrainingArguments
    raise AttributeError(f"module 'fsdp_xla.hf' has no attribute {name!r}")
