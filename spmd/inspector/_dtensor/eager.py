"""``torch.compile`` in a dry run: the script's compiled modules and functions run eagerly.

Dynamo traces a module's call with the hooks it finds; torch's memory tracker follows a step
through global module hooks and FSDP's own, which a compiled ``fully_shard``-ed module calls
where the tracker does not know the module (an ``AssertionError`` from inside the tracker).
What a dry run reports (which collectives a step issues, what a rank holds) is the program's,
not the compiler's, so ``torch.compile(model)`` returns ``model`` and ``torch.compile(fn)``
returns ``fn``, and ``model.compile()`` leaves the module as it is. The report lists where
the script compiled: the memory is eager mode's (compiled code can fuse ops and hold fewer
activations), the collectives the same.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch

from spmd.inspector._dtensor.placeholders import user_line

__all__ = ["RunEagerly"]


class RunEagerly:
    """Inside the block ``torch.compile`` returns what it is given; ``lines`` counts the calls by
    script line (``{'train.py:12': 1}``)."""

    def __init__(self) -> None:
        self.lines: Counter[str] = Counter()

    def _compile(self, original: Any) -> Any:
        @functools.wraps(original)
        def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
            self.lines[user_line() or "(library code)"] += 1
            if model is None:  # @torch.compile(mode=...): a decorator
                return lambda fn: fn
            return model

        return compile

    def __enter__(self) -> RunEagerly:
        self._saved = torch.compile
        torch.compile = self._compile(self._saved)
        return self

    def __exit__(self, *exc: object) -> None:
        torch.compile = self._saved
