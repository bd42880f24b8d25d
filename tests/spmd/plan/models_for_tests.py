"""Factories the planner tests plan by name (``tests.spmd.plan.models_for_tests:branchy``)."""

import torch


class Branchy(torch.nn.Module):
    """A model whose forward branches on a tensor's value, which no tracer can run."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 128)
        self.head = torch.nn.Linear(128, 256)

    def forward(self, tokens: torch.Tensor, **_: object) -> torch.Tensor:
        hidden = self.embed(tokens)
        if hidden.sum() > 0:  # data-dependent control flow
            hidden = hidden * 2
        return self.head(hidden)


def branchy() -> torch.nn.Module:
    return Branchy()
