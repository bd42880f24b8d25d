"""One process, a gloo world of 1 (no torchft): what healing HSDP adds to FSDP on the dtensor
backend. Writes a JSON of:

- ``hook_calls``: gradient shards FSDP handed the replica sync's hook in one backward (one per unit);
- ``hook_scales``: whether what the hook does to a shard is what the optimizer sees (it zeroes it);
- ``transfer``: a replacement's shards and AdamW state taken from a trained peer through
  `ShardState` (pickled, as torchft's transport does): the next step's weights on both, equal or not;
- ``without_optimizer``: the same with the weights only (Adam's moments left fresh), to show the
  optimizer state is what keeps the two in step.

    python tests/workers/ft_state_worker.py OUT.json
"""

import io
import json
import os
import sys

import torch
import torch.distributed as dist

from fsdp_xla import FSDP, transformer_auto_wrap_policy
from fsdp_xla._replicas import ReplicaSync
from fsdp_xla.ft._state import ShardState
from mesh import ParallelDims
from spmd._backend import use_backend


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Counting(ReplicaSync):
    """A stand-in for the replicas: counts the shards and multiplies them by ``scale``."""

    def __init__(self, scale: float) -> None:
        self.calls, self.scale = 0, scale

    def all_reduce_hook(self):
        def hook(shard: torch.Tensor) -> None:
            self.calls += 1
            shard.mul_(self.scale)

        return hook

    def describe(self) -> str:
        return "Counting()"


def model(seed: int, sync: ReplicaSync | None = None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(8, 2))
    policy = transformer_auto_wrap_policy({Block})
    net = FSDP(net, mesh=ParallelDims(fsdp=1).mesh(), auto_wrap_policy=policy, replicate_axis=sync)
    return net, torch.optim.AdamW(net.parameters(), lr=1e-2)


def step(net: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad()
    net(x).square().mean().backward()
    optimizer.step()


def locals_of(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().to_local().clone() for p in net.parameters()]


def hook_results() -> dict:
    sync = Counting(0.0)
    net, _ = model(0, sync)
    net(torch.randn(4, 8)).square().mean().backward()
    zeroed = all(p.grad is not None and not p.grad.to_local().any() for p in net.parameters())
    return {"hook_calls": sync.calls, "hook_scales": zeroed}


def transferred(with_optimizer: bool) -> bool:
    """A peer trained 3 steps; a fresh replacement takes its state; both take step 4."""
    peer, peer_opt = model(0)
    for i in range(3):
        step(peer, peer_opt, i)
    fresh, fresh_opt = model(1)  # other weights, no optimizer state
    sent = io.BytesIO()
    torch.save(ShardState(peer, peer_opt if with_optimizer else None).state_dict(), sent)
    sent.seek(0)
    ShardState(fresh, fresh_opt if with_optimizer else None).load_state_dict(torch.load(sent, weights_only=False))
    step(peer, peer_opt, 3)
    step(fresh, fresh_opt, 3)
    return all(torch.equal(a, b) for a, b in zip(locals_of(peer), locals_of(fresh), strict=True))


def main() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    use_backend("dtensor")
    result = {**hook_results(), "transfer": transferred(True), "without_optimizer": transferred(False)}
    with open(sys.argv[1], "w") as out:
        json.dump(result, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
