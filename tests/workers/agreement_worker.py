"""Run under torchrun (4 ranks, gloo) by test_agreement.py and test_fuzz_ranks.py.

    torchrun --nproc_per_node 4 tests/workers/agreement_worker.py OUT_DIR cases
    torchrun --nproc_per_node 4 tests/workers/agreement_worker.py OUT_DIR fuzz SEED TRIALS

``cases``: each collective entry point called with one rank (or two) differing in one field;
each rank records the error it raised (class, message, seconds taken) in OUT_DIR/rank<r>.json.
Then the agreeing calls, which must not be refused. ``fuzz``: see `tests/workers/rank_fuzz.py`.
A collective left waiting ends after the process group's 20 s timeout, so no case can hang.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard

import spmd
from fsdp_xla.checkpoint import load_sharded, save_sharded
from mesh import Mesh
from spmd import P

spmd.init_process_group("gloo", timeout=20)
spmd.use_backend("dtensor")
rank = dist.get_rank()
out, mode = Path(sys.argv[1]), sys.argv[2]
MESH = Mesh(np.arange(4), (4,), ("x",))
ODD = rank == 3  # the rank that differs


def loader(size=32, seed=0, drop_last=True, batch=8):
    data = [torch.full((3,), float(i)) for i in range(size)]
    return spmd.ProcessDataLoader(data, batch, MESH, P("x"), seed=seed, drop_last=drop_last)


def loader_at(batch):
    """A loader moved to ``batch`` of epoch 0 (a rank that resumed from another position)."""
    made = loader()
    made.load_state_dict({**made.state_dict(), "batch": batch})
    return next(iter(made))


def model(rows=8):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, rows), torch.nn.Linear(rows, 2))


def save_at(step):
    m = spmd.distribute_module(model(), MESH)
    return save_sharded(out / "ckpt", m, extra={"step": step})


def load_from(path):
    m = spmd.distribute_module(model(), MESH)
    return load_sharded(path, m)


CASES = {
    "mark_sharding spec": lambda: spmd.mark_sharding(torch.ones(8, 8), MESH, P("x", None) if ODD else P(None, "x")),
    "mark_sharding mesh order": lambda: spmd.mark_sharding(
        torch.ones(8), Mesh(np.arange(4)[::-1].copy() if ODD else np.arange(4), (4,), ("x",)), P("x")
    ),
    "mark_sharding dtype": lambda: spmd.mark_sharding(
        torch.ones(8, dtype=torch.float64 if ODD else None), MESH, P("x")
    ),
    "mark_sharding shape": lambda: spmd.mark_sharding(torch.ones(6 if ODD else 8, 4), MESH, P("x")),
    "redistribute": lambda: spmd.mark_sharding(
        spmd.mark_sharding(torch.ones(8, 8), MESH, P("x")), MESH, P() if ODD else P(None, "x"), replace=True
    ),
    "distribute_tensor placements": lambda: spmd.distribute_tensor(
        torch.ones(8), spmd.device_mesh(MESH), [Replicate()] if ODD else [Shard(0)]
    ),
    "distribute_module": lambda: spmd.distribute_module(model(rows=6 if ODD else 8), MESH),
    "make_global_tensor spec": lambda: spmd.make_global_tensor(torch.ones(2, 5), MESH, P() if ODD else P("x")),
    "make_global_tensor dtype": lambda: spmd.make_global_tensor(
        torch.ones(2, 5, dtype=torch.int64 if ODD else torch.float32), MESH, P("x")
    ),
    "make_global_tensor shape": lambda: spmd.make_global_tensor(torch.ones(3 if ODD else 2, 5), MESH, P("x")),
    # check=False on one rank: it still takes part in the exchange (it skipped it once, and gloo aborted the job)
    "make_global_tensor check off": lambda: spmd.make_global_tensor(
        torch.ones(2, 5), MESH, P() if ODD else P("x"), check=not ODD
    ),
    "make_global_batch keys": lambda: spmd.make_global_batch(
        {"x": torch.ones(2)} if ODD else {"x": torch.ones(2), "mask": torch.ones(2)}, MESH, P("x")
    ),
    "different calls": lambda: (
        spmd.make_global_tensor(torch.ones(2), MESH, P("x")) if ODD else spmd.mark_sharding(torch.ones(8), MESH, P("x"))
    ),
    "sampler seed": lambda: next(
        iter(spmd.ProcessSampler(32, 8, lambda n: spmd.process_rows(MESH, P("x"), n), seed=1 if ODD else 0))
    ),
    "loader seed": lambda: next(iter(loader(seed=7 if ODD else 0))),
    "loader dataset length": lambda: next(iter(loader(size=30 if ODD else 32))),
    "loader position": lambda: loader_at(2 if ODD else 1),
    "loader drop_last": lambda: next(iter(loader(size=36, drop_last=not ODD))),
    "save_sharded step": lambda: save_at(4 if ODD else 5),
    "load_sharded path": lambda: load_from(out / ("other" if rank >= 2 else "ckpt")),
}


def run_cases():
    record = {}
    for name, call in CASES.items():
        dist.barrier()
        start = time.monotonic()
        try:
            call()
            record[name] = {"error": None, "message": "", "seconds": time.monotonic() - start}
        except Exception as e:
            record[name] = {"error": type(e).__name__, "message": str(e), "seconds": time.monotonic() - start}
        if name == "save_sharded step":  # the load case reads a checkpoint the ranks agreed to write
            save_at(5)
            if rank == 0:
                import shutil

                shutil.copytree(out / "ckpt", out / "other")
    record["agreeing"] = agreeing()
    (out / f"rank{rank}.json").write_text(json.dumps(record))


def _one_process_batch(b):
    """Global batch ``b`` of epoch 0 as one process loads it (`ProcessSampler`'s order)."""
    order = np.random.default_rng([0, 0]).permutation(32)[8 * b : 8 * b + 8]
    return torch.stack([torch.full((3,), float(i)) for i in order])


def agreeing():
    """The same calls with every rank agreeing: each gives the one-process value."""
    full = torch.arange(64.0).reshape(8, 8)
    checks = {
        "mark_sharding": torch.equal(spmd.mark_sharding(full, MESH, P(None, "x")).full_tensor(), full),
        "make_global_tensor": torch.equal(
            spmd.make_global_tensor(full[2 * rank : 2 * rank + 2], MESH, P("x")).full_tensor(), full
        ),
        "make_global_tensor, check off on one rank": torch.equal(
            spmd.make_global_tensor(full[2 * rank : 2 * rank + 2], MESH, P("x"), check=rank != 3).full_tensor(), full
        ),
        "loader": torch.equal(loader_at(1).full_tensor(), _one_process_batch(1)),
        "distribute_module": spmd.distribute_module(model(), MESH) is not None,
        "load": load_from(out / "ckpt") == {"step": 5},
    }
    bad = [k for k, ok in checks.items() if not ok]
    return "ok" if not bad else f"wrong: {bad}"


if mode == "cases":
    run_cases()
else:
    from tests.workers.rank_fuzz import run_fuzz

    run_fuzz(out, rank, int(sys.argv[3]), int(sys.argv[4]))
dist.barrier()
dist.destroy_process_group()
