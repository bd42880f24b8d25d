"""Run under torchrun by test_dtensor_backend.py: our Mesh/PartitionSpec/mark_sharding on DTensor.

    torchrun --nproc_per_node N tests/spmd/dtensor_worker.py OUT.json

For every spec of the meshes below (1 to 3 axes over N ranks, tensors of rank 1 to 3, even,
uneven and empty-block shapes, ids in order and in permuted orders): each rank's block equals
what our pure `NamedSharding.shard_bounds` says (torch_xla's block for that device id),
`get_sharding` of the DTensor equals `hlo_sharding_for`, and the collectives are right too:
``full_tensor`` gives the whole value back and a redistribute to another spec gives every rank
that spec's block. A layout DTensor cannot hold raises `ShardingError`; a permuted mesh on a
torch that cannot order process groups (2.9) raises `MeshError`. Then sharded matmuls and
reductions equal the single-process result, on an in-order and a permuted mesh. Rank 0 writes
the counts and any mismatch to OUT.
"""

import json
import sys

import numpy as np
import torch
import torch.distributed as dist

import spmd
from mesh import Mesh, MeshError
from spmd import PartitionSpec, ShardingError, get_sharding, hlo_sharding_for, mark_sharding, with_sharding_constraint
from spmd._util import torch_compat
from tests.spmd.specs import all_specs

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
MESH_SHAPES = {4: [(4,), (2, 2), (1, 4)], 8: [(8,), (2, 4), (4, 2), (2, 2, 2)]}[world]
SHAPES = {1: [(8,), (10,), (3,), (1,)], 2: [(8, 12), (10, 6), (1, 3)], 3: [(4, 6, 8), (5, 3, 9)]}
ORDERED_GROUPS = torch_compat.ordered_groups_supported()
counts = {"cases": 0, "refused": 0, "permuted_cases": 0, "permuted_refused": 0, "mismatches": [], "refusals": []}


def id_orders(mesh_shape):
    """In order, transposed, reversed and seeded random permutations of the ranks."""
    n = int(np.prod(mesh_shape))
    orders = [np.arange(n), np.arange(n)[::-1].copy()]
    if len(mesh_shape) > 1:
        orders.append(np.arange(n).reshape(mesh_shape[::-1]).T.reshape(-1))
    rng = np.random.default_rng(sum(mesh_shape))
    orders += [rng.permutation(n) for _ in range(2)]
    return orders if world == 4 else [orders[0], orders[2 if len(mesh_shape) > 1 else 1], orders[-1]]


def check_case(mesh, spec, shape, other):
    """Blocks, get_sharding, full_tensor and a redistribute to ``other`` for one layout."""
    full = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
    dt = mark_sharding(full, mesh, spec)
    where = f"{mesh.mesh_shape} ids={mesh.device_ids.tolist()} {spec} {shape}"
    ours = {b.device: b for b in spmd.NamedSharding(mesh, PartitionSpec(*spec)).shard_bounds(shape)}
    local = dt.to_local()
    if tuple(local.shape) != tuple(full[ours[rank].index].shape) or not torch.equal(local, full[ours[rank].index]):
        counts["mismatches"].append(f"{where}: block")
    if get_sharding(dt) != hlo_sharding_for(mesh, PartitionSpec(*spec), len(shape), shape):
        counts["mismatches"].append(f"{where}: get_sharding {get_sharding(dt)}")
    if not torch.equal(dt.full_tensor(), full):
        counts["mismatches"].append(f"{where}: full_tensor")
    if world > 4:  # redistributes are checked on 4 ranks; 8 would double the run
        return
    try:
        moved = with_sharding_constraint(dt, mesh, other)
    except ShardingError:
        return
    theirs = {b.device: b for b in spmd.NamedSharding(mesh, PartitionSpec(*other)).shard_bounds(shape)}
    if not torch.equal(moved.to_local(), full[theirs[rank].index]):
        counts["mismatches"].append(f"{where}: redistribute to {other}")


for mesh_shape in MESH_SHAPES:
    for ids in id_orders(mesh_shape):
        mesh = Mesh(ids, mesh_shape, tuple("xyz"[: len(mesh_shape)]))
        permuted = not np.array_equal(ids, np.arange(len(ids)))
        for tensor_rank, shapes in SHAPES.items():
            specs = list(all_specs(len(mesh_shape), tensor_rank))
            for i, spec in enumerate(specs):
                for shape in shapes:
                    try:
                        check_case(mesh, spec, shape, specs[(i + 1) % len(specs)])
                    except (ShardingError, MeshError) as e:
                        counts["refused"] += 1
                        counts["permuted_refused"] += permuted
                        if len(counts["refusals"]) < 400:
                            counts["refusals"].append(f"{type(e).__name__}: {str(e)[:400]}")
                        continue
                    counts["cases"] += 1
                    counts["permuted_cases"] += permuted

# A reversed mesh: laid out in mesh order where torch can order groups, refused (saying why) where not.
try:
    reversed_mesh = Mesh(np.arange(world)[::-1].copy(), (world,), ("x",))
    got = mark_sharding(torch.arange(float(world)), reversed_mesh, ("x",))
    counts["reversed_mesh"] = {"local": got.to_local().tolist(), "full": got.full_tensor().tolist()}
except MeshError as e:
    counts["reversed_mesh_error"] = str(e)

# Numerics: sharded operands, the DTensor result equals the single-process one.
torch.manual_seed(0)
a, b = torch.randn(16, 24), torch.randn(24, 8)
meshes = [Mesh(np.arange(world), (2, world // 2), ("data", "model"))]
if ORDERED_GROUPS:  # a 2-D mesh whose ids decrease along both axes
    meshes.append(Mesh(np.arange(world)[::-1].copy(), (2, world // 2), ("data", "model")))
for mesh in meshes:
    for a_spec, b_spec in [
        (("data", None), (None, "model")),
        (("data", "model"), ("model", None)),
        ((None, ("data", "model")), (("data", "model"), None)),
    ]:
        out = mark_sharding(a, mesh, a_spec) @ mark_sharding(b, mesh, b_spec)
        if not torch.allclose(out.full_tensor(), a @ b, rtol=1e-5, atol=1e-5):
            counts["mismatches"].append(f"matmul {a_spec} @ {b_spec} on ids {mesh.device_ids.tolist()}")
mesh = meshes[0]
x = mark_sharding(a, mesh, ("model", "data"))
for name, got, want in [
    ("sum0", x.sum(dim=0), a.sum(dim=0)),
    ("amax1", x.amax(dim=1), a.amax(dim=1)),
    ("mean", x.mean(), a.mean()),
]:
    if not torch.allclose(got.full_tensor(), want, rtol=1e-5, atol=1e-5):
        counts["mismatches"].append(f"reduction {name}")
y = with_sharding_constraint(x, mesh, ("data", None))  # a redistribute, value unchanged
if not (
    torch.equal(y.full_tensor(), a)
    and str(get_sharding(y)) == str(hlo_sharding_for(mesh, PartitionSpec("data", None), 2))
):
    counts["mismatches"].append("with_sharding_constraint")
w = mark_sharding(torch.randn(24, 8, requires_grad=True), mesh, (None, "model"))  # the value to keep
loss = (mark_sharding(a, mesh, ("data", None)) @ w).sum()
loss.backward()
if w.grad is None or not torch.allclose(
    w.grad.full_tensor(), a.sum(dim=0)[:, None].expand(24, 8), rtol=1e-5, atol=1e-5
):
    counts["mismatches"].append("gradient of the DTensor mark_sharding returned")
# with_sharding_constraint's backward lays the gradient out as its input was, even when the
# forward moved nothing (a redistribute to the same layout).
x = mark_sharding(a.clone().requires_grad_(), mesh, ("data", None))
x.retain_grad()
(with_sharding_constraint(x, mesh, ("data", None)) @ mark_sharding(b, mesh, (None, "model"))).sum().backward()
if get_sharding(x.grad) != get_sharding(x) or not torch.allclose(x.grad.full_tensor(), b.sum(1).expand(16, 24)):
    counts["mismatches"].append("gradient layout through with_sharding_constraint")


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 24)
        self.proj = torch.nn.Linear(24, 24)
        self.head = torch.nn.Linear(24, 8, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.full((24,), 0.5))

    def forward(self, idx):
        return self.head(self.proj(self.emb(idx)) * self.scale)


torch.manual_seed(0)
plain, tied = Tied(), Tied()
tied.load_state_dict(plain.state_dict())
spmd.shard_parameters(tied, mesh, {"emb.weight": (None, "model"), "proj.weight": ("model", None)})
idx = torch.randint(0, 8, (4, 6))
got = tied(mark_sharding(idx, mesh, ("data", None)))
if not (
    tied.head.weight is tied.emb.weight
    and all(type(p).__name__ == "DTensor" for p in tied.parameters())
    and type(tied.scale).__name__ == "DTensor"
    and get_sharding(tied.proj.bias).is_replicated
    and str(get_sharding(tied.proj.weight)) == str(hlo_sharding_for(mesh, PartitionSpec("model", None), 2))
    and torch.allclose(got.full_tensor(), plain(idx), rtol=1e-5, atol=1e-6)
):
    counts["mismatches"].append("shard_parameters")
try:
    spmd.shard_parameters(Tied(), mesh, {"emb.wieght": ("model",)})
    counts["mismatches"].append("shard_parameters accepted an unknown name")
except ShardingError as e:
    counts["shard_parameters_error"] = str(e)


# distribute_module whose partition_fn fails on a later submodule leaves every parameter and
# buffer as it was: the same objects, plain tensors (the first layer's DTensors put back).
def fails_on_the_second_layer(name, sub, mesh):
    if name == "1":
        raise KeyError("no layout for the second layer")
    if name == "0":
        spmd.shard_parameters(sub, mesh, {"weight": ("model", None)})


refused = torch.nn.Sequential(torch.nn.Linear(24, 24), torch.nn.Linear(24, 8), torch.nn.BatchNorm1d(8))
before = {n: (t, t.device) for n, t in [*refused.named_parameters(), *refused.named_buffers()]}
try:
    spmd.distribute_module(refused, mesh, fails_on_the_second_layer)
    counts["mismatches"].append("distribute_module did not raise")
except KeyError:
    after = {n: (t, t.device) for n, t in [*refused.named_parameters(), *refused.named_buffers()]}
    if after.keys() != before.keys() or any(
        after[n][0] is not t or after[n][1] != device or type(t).__name__ == "DTensor"
        for n, (t, device) in before.items()
    ):
        counts["mismatches"].append("a refused distribute_module changed the module")
    counts["distribute_module_refused"] = True

# clear_sharding gives the value back replicated (a DTensor's layout is its type).
cleared = spmd.clear_sharding(mark_sharding(a, mesh, ("data", "model")))
if not (get_sharding(cleared).is_replicated and torch.equal(cleared.to_local(), a)):
    counts["mismatches"].append("clear_sharding")
# DTensor's vocabulary through spmd: DeviceMesh <-> Mesh, placements where a spec goes.
vocab_mesh = Mesh(np.arange(world), (2, world // 2), ("data", "model"))
dm = spmd.device_mesh(vocab_mesh)
from torch.distributed.tensor import Replicate, Shard  # noqa: E402

by_placements = spmd.distribute_tensor(a, dm, [Replicate(), Shard(1)])
if not (
    Mesh.from_device_mesh(dm) == vocab_mesh
    and spmd.init_device_mesh((2, world // 2), ("data", "model")).mesh.tolist() == dm.mesh.tolist()
    and get_sharding(by_placements) == get_sharding(mark_sharding(a, vocab_mesh, (None, "model")))
    and torch.equal(by_placements.full_tensor(), a)
):
    counts["mismatches"].append("device_mesh / distribute_tensor with placements")

# A mesh of more devices than processes: the fix is more processes.
try:
    mark_sharding(torch.zeros(8), Mesh(np.arange(2 * world), (2 * world,), ("x",)), ("x",))
    counts["mismatches"].append("a mesh larger than the world was accepted")
except spmd.DeviceCountError as e:
    counts["larger_mesh_error"] = str(e)

# A "global" tensor whose shape differs on one rank (a short last batch): refused on every rank,
# naming both shapes, where DTensor cut rank 0's data by each rank's own shape.
try:
    mark_sharding(torch.ones(8 if rank == 0 else 6, 4), mesh, ("data",))
    counts["mismatches"].append("a global tensor of different shapes on the ranks was accepted")
except spmd.LocalShapeMismatchError as e:
    counts["shape_mismatch_error"] = str(e)

if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"world": world, "ordered_groups": ORDERED_GROUPS, **counts}, f)
dist.destroy_process_group()
