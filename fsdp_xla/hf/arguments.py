"""`TrainingArguments`: transformers' own, with the ``fsdp_config`` file checked by our reader first.

transformers parses ``fsdp_config.json`` inside ``TrainingArguments(...)``, before any Trainer
exists, and a typo there surfaces as a bare ``json.JSONDecodeError`` without the file's name.
This subclass reads the file with `read_fsdp_config` first, so the error is an `HFConfigError`
naming the file, the line and the column (or the unknown key, with the closest valid one).
"""

from __future__ import annotations

import os

import transformers

from fsdp_xla.hf.config import read_fsdp_config

__all__ = ["TrainingArguments"]


class TrainingArguments(transformers.TrainingArguments):
    """``transformers.TrainingArguments`` that validates ``fsdp_config`` when it is built.

    Raises:
        HFConfigError: the ``fsdp_config`` file is missing, not JSON, or holds an unknown key
            or a value of the wrong type.
    """

    def __post_init__(self) -> None:
        if self.fsdp and isinstance(self.fsdp_config, (str, os.PathLike)):
            read_fsdp_config(self.fsdp_config, warn=False)
        super().__post_init__()
