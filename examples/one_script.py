"""One training script in DTensor's terms, run unchanged on both runtimes.

    torchrun --nproc_per_node 4 examples/one_script.py   # torch.distributed DTensor, 4 processes
    python examples/one_script.py                        # torch_xla: GSPMD, one process, 8 devices
                                                         # (without torch_xla: launches 4 DTensor ranks)

It speaks DTensor's vocabulary only: a ``DeviceMesh`` (`spmd.init_device_mesh`), placements
(``Shard``, ``Replicate``), `spmd.distribute_module` with a partition function,
`spmd.distribute_tensor`, ``redistribute`` and ``full_tensor``. `spmd` runs each call on the
runtime of the process: DTensor under torchrun or where torch_xla is not installed, torch_xla
otherwise (``--backend`` overrides). A 2-layer MLP is tensor-parallel on ``model`` (the first
layer's output features, the second's input features) and data-parallel on ``data``; the losses
equal one process's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if "WORLD_SIZE" not in os.environ:  # one process: torch_xla with 8 virtual devices on a CPU host
    from spmd import configure_default_devices

    configure_default_devices(8)

try:
    from examples import _lane  # the repository is on the path (tests, PYTHONPATH)
except ImportError:
    import _lane  # run as a script: examples/ is on the path

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.tensor import Replicate, Shard  # noqa: E402

import spmd  # noqa: E402

D_IN, HIDDEN, BATCH, LR = 16, 64, 32, 0.5


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(D_IN, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, D_IN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x).relu())


def tensor_parallel(name: str, module: torch.nn.Module, mesh) -> None:
    """Column-parallel ``up``, row-parallel ``down`` over ``model``; the rest replicated."""
    if name == "up":
        spmd.shard_parameters(module, mesh, {"weight": [Replicate(), Shard(0)], "bias": [Replicate(), Shard(0)]})
    elif name == "down":
        spmd.shard_parameters(module, mesh, {"weight": [Replicate(), Shard(1)]})


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fresh inputs every step, targets a fixed linear map of them: learnable, so the loss falls."""
    gen = torch.Generator().manual_seed(1)
    target_map = torch.randn(D_IN, D_IN, generator=gen) / D_IN**0.5
    inputs = [torch.randn(BATCH, D_IN, generator=gen) for _ in range(steps)]
    return [(x, x @ target_map) for x in inputs]


def train(steps: int) -> list[float]:
    """``steps`` SGD steps of the tensor-parallel MLP over every device of the runtime."""
    mesh = spmd.init_device_mesh((2, spmd.device_count() // 2), ("data", "model"))
    torch.manual_seed(0)
    model = spmd.distribute_module(MLP(), mesh, tensor_parallel)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches(steps):
        x = spmd.distribute_tensor(x, mesh, [Shard(0), Replicate()])
        y = spmd.distribute_tensor(y, mesh, [Shard(0), Replicate()])
        out = model(x).redistribute(mesh, [Shard(0), Replicate()])  # sum the row-parallel partial results
        loss = (out - y).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        spmd.step()
        losses.append(loss.full_tensor().item())
    return losses


def main(argv: list[str] | None = None) -> list[float]:
    parser = _lane.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=_lane.at_least(1), default=10)
    parser.add_argument("--json", type=_lane.output_file, help="write the losses here (rank 0)")
    parser.add_argument(
        "--backend", choices=["torch_xla", "dtensor"], help="default: dtensor under torchrun or without torch_xla"
    )
    args = parser.parse_args(argv)
    on_dtensor = _lane.settle_backend(args.backend, __file__, argv) == "dtensor"
    started = on_dtensor and not dist.is_initialized()
    if started:
        dist.init_process_group("gloo")
    elif not on_dtensor:
        spmd.enable_spmd()
    losses = train(args.steps)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"{spmd.backend_for().name} over {spmd.device_count()} devices: losses {[round(v, 5) for v in losses]}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"backend": spmd.backend_for().name, "losses": losses}, f)
    if started:
        dist.destroy_process_group()
    return losses


def one_process_losses(steps: int) -> list[float]:
    """The same training in one process on one device, plain torch: the reference."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in batches(steps):
        loss = (model(x) - y).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    main(sys.argv[1:])
