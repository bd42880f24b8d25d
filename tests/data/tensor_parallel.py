"""A training script that uses torch alone (it never imports this project) and never calls
``fully_shard``: a two-layer MLP under a tensor parallel plan (``parallelize_module`` with
``ColwiseParallel`` / ``RowwiseParallel``) on a 1-D device mesh, AdamW, or with
``--no-optimizer`` a hand-written SGD update. Run it under torchrun; ``python -m spmd.inspector
--world N`` dry-runs it unchanged.

``--hidden`` need not divide by the world (the last ranks then hold fewer rows of the sharded
weights, or none), and ``--first-rank k`` builds the mesh in the order k, k+1, ..., 0, ..., k-1,
so the largest shards (mesh coordinate 0) are rank k's, not rank 0's."""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256, help="the sharded dim (out of fc1, into fc2)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--first-rank", type=int, default=0, help="the rank at mesh coordinate 0")
    parser.add_argument("--no-optimizer", action="store_true", help="update the weights by hand (SGD)")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches (forward and backward) per step")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    order = [(args.first_rank + i) % world for i in range(world)]
    mesh = DeviceMesh("cpu", order, mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.d, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.d)
    )
    # The hidden activation stays a DTensor between the layers: a local tensor would lose its global
    # shape (from_local assumes even shards), and --hidden need not divide by the world.
    parallelize_module(model, mesh, {"0": ColwiseParallel(use_local_output=False), "2": RowwiseParallel()})
    optimizer = None if args.no_optimizer else torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        for _ in range(args.accumulate):
            x = torch.randn(args.batch, args.d)
            loss = model(x).pow(2).mean()
            loss.backward()
        if optimizer is None:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 1e-3 * p.grad
                    p.grad = None
        else:
            optimizer.step()
            optimizer.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
