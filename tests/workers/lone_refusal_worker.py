"""Run under torchrun by tests/test_bad_input.py: an argument refused on one rank only, and
process-group and checkpoint misuse, and FSDP of a model that differs on one rank, on 2 gloo
ranks (issue 36).

    torchrun --nproc_per_node 2 tests/workers/lone_refusal_worker.py OUT_DIR

Each rank writes rank<r>.json into OUT_DIR: {case: [error class, message, seconds]}.
"""

import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import fsdp_xla
import fsdp_xla.checkpoint as ck
import spmd
from mesh import Mesh
from spmd import P

TIMEOUT = 30  # seconds a collective may wait: a rank left waiting would take this long, then fail raw
spmd.init_process_group("gloo", timeout=TIMEOUT)
spmd.use_backend("dtensor")
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(sys.argv[1])
mesh = Mesh(np.arange(world), (world,), ("data",))
results = {}


def case(name, call):
    started = time.monotonic()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
        results[name] = ["ok", "", time.monotonic() - started]
    except Exception as e:
        results[name] = [type(e).__name__, str(e), time.monotonic() - started]
    dist.barrier()


case(
    "check_no_on_one_rank",
    lambda: spmd.make_global_tensor(torch.zeros(4, 2), mesh, P("data"), check="no" if rank else True),
)
case("list_on_one_rank", lambda: spmd.make_global_tensor([1.0] if rank else torch.zeros(4, 2), mesh, P("data")))
case("int_key_on_one_rank", lambda: spmd.make_global_batch({(1 if rank else "x"): torch.zeros(4)}, mesh, P("data")))
case("check_no_on_every_rank", lambda: spmd.make_global_tensor(torch.zeros(4, 2), mesh, P("data"), check="no"))
case("init_twice", lambda: spmd.init_process_group("gloo"))
case("init_unknown_keyword", lambda: spmd.init_process_group("gloo", bogus=1))
case(
    "fsdp_of_another_model_on_one_rank",
    lambda: fsdp_xla.fully_shard(
        torch.nn.Sequential(torch.nn.Linear(4, 4 + 2 * rank)), mesh=Mesh(np.arange(world), (world,), ("fsdp",))
    ),
)
context = Mesh(np.arange(world), (world,), ("context",))
case(
    "context_parallel_strategy_on_one_rank",
    lambda: spmd.context_parallel(torch.nn.Linear(2, 2), context, strategy="ring" if rank else "all_gather"),
)
case(
    "context_parallel_load_balance_differs",
    lambda: spmd.context_parallel(torch.nn.Linear(2, 2), context, load_balance=bool(rank)),
)
case(
    "fsdp_axis_on_one_rank",
    lambda: fsdp_xla.fully_shard(
        torch.nn.Linear(4, 4), mesh=Mesh(np.arange(world), (world,), ("fsdp",)), fsdp_axis="nope" if rank else None
    ),
)


def exchanges_to_wrap():
    """How many exchanges between the ranks FSDP makes to wrap a model every rank agrees on."""
    from spmd.backend import DTensorBackend

    made, real = [], DTensorBackend.all_process_values

    def counted(self, values, **kwargs):
        made.append(len(values))
        return real(self, values, **kwargs)

    DTensorBackend.all_process_values = counted
    try:
        fsdp_xla.fully_shard(torch.nn.Linear(4, 4), mesh=Mesh(np.arange(world), (world,), ("fsdp",)))
    finally:
        DTensorBackend.all_process_values = real
    results["exchanges_to_wrap"] = [len(made), "", 0.0]


exchanges_to_wrap()
case("plain_model_saved_by_every_rank", lambda: ck.save_sharded(out / "plain", torch.nn.Linear(2, 2)))
(out / f"rank{rank}.json").write_text(json.dumps(results))
dist.destroy_process_group()
