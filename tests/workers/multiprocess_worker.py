"""Run under torchrun (4 ranks, gloo) by test_multiprocess.py: per-process input on the dtensor backend.

    torchrun --nproc_per_node 4 tests/multiprocess_worker.py OUT_DIR TRAIN_ARGS...

1. `make_global_tensor` from each rank's own rows (`process_rows`) on a (4,) and a (2, 2) mesh,
   in order and permuted: the DTensor's ``full_tensor`` is the global tensor; a dict batch with
   a spec per key; and the errors: ranks passing different shapes, a batch that does not
   divide, a key without a spec.
2. examples/train_fsdp.py with TRAIN_ARGS (its data from `ProcessDataLoader`, each rank its
   quarter of every batch), and on rank 0 the same model trained eagerly in one process on the
   global batches a one-process `ProcessSampler` gives: the losses must agree. The FSDP losses
   are also the uninterrupted reference of the fault test.

Rank 0 writes OUT_DIR/results.json.
"""

import json
import sys
from pathlib import Path

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import spmd  # noqa: E402
from examples import train_fsdp  # noqa: E402
from mesh import Mesh  # noqa: E402
from spmd import P, ProcessSampler, make_global_batch, make_global_tensor, process_rows  # noqa: E402
from spmd._util import torch_compat  # noqa: E402

spmd.init_process_group("gloo", timeout=120)
spmd.use_backend("dtensor")
rank = dist.get_rank()
out, train_args = Path(sys.argv[1]), sys.argv[2:]
result = {"mismatches": [], "errors": {}, "cases": 0}


def rows_of(mesh, spec, full):
    """This rank's local data of ``full``: its rows along each dim the spec splits."""
    index = [process_rows(mesh, spec, n, dim=d) for d, n in enumerate(full.shape)]
    return full[np.ix_(*index)]


def check_tensors():
    full = torch.arange(8 * 8, dtype=torch.float32).reshape(8, 8)
    meshes = [Mesh(np.arange(4), (4,), ("data",)), Mesh(np.arange(4), (2, 2), ("data", "model"))]
    if torch_compat.ordered_groups_supported():  # torch 2.13+: permuted meshes
        meshes += [Mesh(np.array([3, 1, 0, 2]), (2, 2), ("data", "model"))]
    for mesh in meshes:
        for spec in [P("data"), P("data", "model"), P(("data", "model")), P(None, "data"), P()]:
            if "model" in str(spec) and mesh.ndim == 1:
                continue
            local = rows_of(mesh, spec, full)
            made = make_global_tensor(local, mesh, spec)
            result["cases"] += 1
            if not torch.equal(made.full_tensor(), full) or spmd.get_sharding(made) != spmd.hlo_sharding_for(
                mesh, spec, 2, (8, 8)
            ):
                result["mismatches"].append(f"{mesh.device_ids.tolist()} {spec}")
    mesh = meshes[1]
    batch = {"input_ids": torch.arange(8 * 4).reshape(8, 4), "mask": torch.arange(8 * 4).reshape(8, 4) % 3}
    batch["labels"] = torch.arange(8)
    specs = {"input_ids": P("data"), "mask": P("data", "model"), "labels": P("data")}
    local = {k: rows_of(mesh, specs[k], v) for k, v in batch.items()}
    made = make_global_batch(local, mesh, specs)
    result["dict_ok"] = all(torch.equal(made[k].full_tensor(), batch[k]) for k in batch)
    result["dict_local_rows"] = made["labels"].to_local().tolist()


def check_errors():
    mesh = Mesh(np.arange(4), (4,), ("data",))
    cases = {
        "shapes": lambda: make_global_tensor(torch.ones(3 if rank == 2 else 2, 5), mesh, P("data")),
        "indivisible": lambda: process_rows(mesh, P("data"), 10),
        "missing": lambda: make_global_batch({"x": torch.ones(2), "mask": torch.ones(2)}, mesh, {"x": P("data")}),
    }
    for name, call in cases.items():
        try:
            call()
            result["errors"][name] = None
        except spmd.ProcessDataError as e:
            result["errors"][name] = f"{type(e).__name__}: {e}"


def eager_losses(args):
    """The model train_fsdp builds, trained in this one process on the one-process batches."""
    torch.manual_seed(0)
    model = train_fsdp.GPT(vocab=args.vocab, d_model=args.d_model, n_head=args.heads, n_layer=args.layers, seq=args.seq)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = train_fsdp.SyntheticTokens(args.dataset_rows, args.seq, args.vocab)
    sampler, losses = ProcessSampler(len(data), args.batch, seed=0), []
    batches = (b for _ in range(args.steps) for b in sampler)
    for _ in range(args.steps):
        tokens = torch.stack([data[i] for i in next(batches)])
        losses.append(train_fsdp.train_step(model, optimizer, tokens).item())
    return losses


check_tensors()
check_errors()
result["fsdp_losses"] = train_fsdp.main(train_args)
if rank == 0:
    result["eager_losses"] = eager_losses(train_fsdp.parse_args(train_args))
    (out / "results.json").write_text(json.dumps(result))
dist.barrier()
dist.destroy_process_group()
