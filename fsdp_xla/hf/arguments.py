"""`TrainingArguments`: transformers' own, with the ``fsdp_config`` (file or dict) checked by our reader first.

transformers parses ``fsdp_config.json`` inside ``TrainingArguments(...)``, before any Trainer
exists, and a typo there surfaces as a bare ``json.JSONDecodeError`` without the file's name.
This subclass reads the file with `read_fsdp_config` first, so the error is an `HFConfigError`
naming the file, the line and the column (or the unknown key, with the closest valid one). A
dict ``fsdp_config`` gets the same checks of keys and values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import transformers

from fsdp_xla.hf.config import read_fsdp_config

__all__ = ["TrainingArguments"]


class TrainingArguments(transformers.TrainingArguments):
    """``transformers.TrainingArguments`` that validates ``fsdp_config`` when it is built.

    Raises:
        HFConfigError: the ``fsdp_config`` file is missing, not JSON, or (file or dict) holds
            an unknown key or a value of the wrong type.
    """

    def __post_init__(self) -> None:
        # A dict is checked as a file is: its values reached transformers unchecked (a string
        # 'false' read as true, a negative min_num_params) and failed there or not at all.
        if self.fsdp and self.fsdp_config is not None:
            read_fsdp_config(self.fsdp_config, warn=False)
            if isinstance(self.fsdp_config, Mapping):  # transformers reads the string 'false' as true
                self.fsdp_config = _real_bools(self.fsdp_config)
        super().__post_init__()


def _real_bools(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` whose "true"/"false" strings (which `read_fsdp_config` takes, as JSON
    configs write them) are bools, in the settings too: transformers tests them for truth."""

    def value(v: Any) -> Any:
        if isinstance(v, str) and v.lower() in ("true", "false"):
            return v.lower() == "true"
        return {k: value(x) for k, x in v.items()} if isinstance(v, Mapping) else v

    return {k: value(v) for k, v in config.items()}
