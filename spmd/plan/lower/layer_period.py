"""Layer stacks whose blocks differ in kind: the period the scan runs, and the layers that stand in.

Some models repeat a pattern of layers, not one layer: Gemma 3 five sliding-window layers then one
global (``config.layer_types``), Gemma 2 one of each, SmolLM3 and Llama 4 a layer without rotary
embeddings every fourth (``use_rope``). Their blocks share parameter shapes, but a block's
attention module says which kind it is (``layer_type``, ``sliding_window``), and the model hands
each kind its own mask and position embeddings. The scan then runs one period of the pattern a
trip (MaxText scans Gemma 3's six layers as one block): every layer keeps its own window, and the
compiler still compiles one period, not L layers. Layers left after the last whole period run
after the scan. A stack whose kinds do not repeat (Qwen2's ``max_window_layers``: full layers,
then sliding ones) is one period: correct, but compiled as long as the unrolled stack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from spmd.plan.errors import TracingError

__all__ = ["PeriodCalls", "PeriodLayer", "layer_period"]

# A block's attributes that change what it computes without changing its parameters.
_KIND_ATTRIBUTES = ("layer_type", "attention_type", "sliding_window", "is_sliding", "use_rope")


def _kind(block: torch.nn.Module) -> tuple[Any, ...]:
    return tuple(
        (path, name, value)
        for path, module in block.named_modules()
        for name in _KIND_ATTRIBUTES
        if isinstance(value := getattr(module, name, None), str | int | bool)
    )


def layer_period(layers: torch.nn.ModuleList) -> int:
    """The shortest run of blocks whose kinds repeat through ``layers`` (1: all of one kind)."""
    kinds = [_kind(block) for block in layers]
    return next(p for p in range(1, len(kinds) + 1) if all(k == kinds[i % p] for i, k in enumerate(kinds)))


@dataclass
class PeriodCalls:
    """What a stack's stand-ins record of one forward, shared by all of them (mutable: it fills as
    the model calls its layers).

    Attributes:
        order: the positions called so far, in order.
        hidden: the hidden states the last call was given (the next must be given them too).
        arguments: each kind's ``(args, kwargs)`` by its position in the first period.
    """

    order: list[int] = field(default_factory=list)
    hidden: Any = None
    arguments: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=dict)


class PeriodLayer(torch.nn.Module):
    """Stands in for ``layer``, at ``position`` of a stack scanned by periods (module docstring).
    The model calls every layer in order, each on the last one's output: the first period's calls
    leave their arguments in ``calls.arguments`` (each kind's mask and position embeddings), the last call
    runs every layer with them (``run(hidden, calls)``), and the others pass the hidden states
    through. A model that skips, repeats or reorders layers, or changes the hidden states between
    them, is refused (`TracingError`): the scan would not compute what it does. The stand-in keeps
    its layer's kind attributes, which some models' loops read."""

    def __init__(self, layer: torch.nn.Module, position: int, layers: int, period: int, calls: PeriodCalls,
                 run: Callable[[Any, PeriodCalls], Any]):  # fmt: skip
        super().__init__()
        self.position, self.last, self.period = position, position == layers - 1, period
        self.__dict__["calls"] = calls  # shared by the stack's stand-ins, not module state
        self.__dict__["run"] = run
        for name in _KIND_ATTRIBUTES:
            if hasattr(layer, name):
                setattr(self, name, getattr(layer, name))

    def forward(self, hidden: Any, *args: Any, **kwargs: Any) -> Any:
        calls = self.calls
        if self.position != len(calls.order) or (calls.order and hidden is not calls.hidden):
            raise TracingError(
                "The planner scans this model's layers by periods of their kinds, which needs its forward to call "
                f"every layer once, in order, each on the last one's output; layer {self.position} was called "
                f"after {len(calls.order)} layers{'' if hidden is calls.hidden else ' on other hidden states'}."
            )
        calls.order.append(self.position)
        calls.hidden = hidden
        if self.position < self.period:
            calls.arguments[self.position] = (args, kwargs)
        return self.run(hidden, self.calls) if self.last else hidden
