"""A seeded multi-process fuzz of the collective entry points, run inside agreement_worker.py (4
gloo ranks) for tests/test_fuzz_ranks.py.

Every rank draws the same trials from one seed. A trial picks an entry point and arguments that
fit (a mesh in order or permuted, a spec, a dtype, a shape, a loader's seed and position); in
about half the trials one rank, drawn too, passes another value of one field. The property:

- all ranks agree: the call gives what one process would (the global tensor, the one-process
  loader's batch);
- one rank differs: every rank raises the same `RankDisagreementError` (message word for word),
  whose ``fields`` name the field drawn, with the odd rank alone in its group;
- every trial ends within 30 s (a collective left waiting would end at the group's 20 s timeout).

Each rank's verdicts go to rank 0, which writes OUT_DIR/fuzz.json.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import spmd
from mesh import Mesh
from spmd import P
from spmd._util import torch_compat
from spmd.errors import RankDisagreementError

MESHES = [Mesh(np.arange(4), (4,), ("x",)), Mesh(np.arange(4), (2, 2), ("data", "model"))]
if torch_compat.ordered_groups_supported():  # torch 2.13+: a permuted mesh lays blocks out in mesh order
    MESHES.append(Mesh(np.array([3, 1, 0, 2]), (2, 2), ("data", "model")))
SPECS = {
    1: [P(), P("x"), P(None, "x")],
    2: [P(), P("data"), P("data", "model"), P(("data", "model")), P(None, "model"), P("model", "data")],
}
DTYPES = [torch.float32, torch.float64, torch.int64]
FIELDS = {
    "mark_sharding": ["spec", "mesh", "dtype", "shape"],
    "distribute_tensor": ["spec", "mesh", "dtype"],
    "make_global_tensor": ["spec", "mesh", "dtype", "local shape"],
    "loader": ["seed", "dataset_size", "batch", "global_batch", "drop_last", "shuffle"],
}


def _other(rng: random.Random, choices: list, value: object) -> object:
    return rng.choice([c for c in choices if c is not value and c != value])


def draw(rng: random.Random) -> dict:
    """One trial: the surface, the agreed arguments, and (maybe) the rank and field that differ."""
    surface = rng.choice(sorted(FIELDS))
    mesh = rng.choice(MESHES)
    trial = {
        "surface": surface,
        "mesh": mesh,
        "spec": rng.choice(SPECS[mesh.ndim]),
        "dtype": rng.choice(DTYPES),
        "rows": 8,
        "seed": rng.randrange(3),
        "dataset_size": rng.choice([32, 40]),
        "batch": rng.randrange(3),
        "global_batch": rng.choice([8, 4]),
        "drop_last": rng.choice([True, False]),
        "shuffle": rng.choice([True, False]),
    }
    trial["odd"], trial["field"] = None, None
    if rng.random() < 0.5:
        trial["odd"], trial["field"] = rng.randrange(4), rng.choice(FIELDS[surface])
        trial["other"] = _changed(rng, trial)
    return trial


def _changed(rng: random.Random, trial: dict) -> dict:
    """The arguments of the rank that differs: one field changed."""
    field, other = trial["field"], dict(trial)
    # its rows are cut as the others' are: only the call differs (a mesh the spec does not fit
    # would fail in the worker's own cutting, before the call, on that rank alone)
    other["rows_layout"] = (trial["mesh"], trial["spec"])
    if field == "spec":
        other["spec"] = _other(rng, SPECS[trial["mesh"].ndim], trial["spec"])
    elif field == "mesh":
        other["mesh"] = _other(rng, MESHES, trial["mesh"])
    elif field == "dtype":
        other["dtype"] = _other(rng, DTYPES, trial["dtype"])
    elif field in ("shape", "local shape"):
        other["rows"] = 4
    elif field in ("seed", "batch"):
        other[field] = trial[field] + 1
    elif field == "dataset_size":
        other[field] = trial[field] + 8
    elif field == "global_batch":
        other[field] = 12 - trial[field]  # 8 <-> 4
    else:
        other[field] = not trial[field]
    return other


def _full(args: dict) -> torch.Tensor:
    return torch.arange(args["rows"] * 4).reshape(args["rows"], 4).to(args["dtype"])


def _rows_of(mesh: Mesh, spec: P, full: torch.Tensor) -> torch.Tensor:
    index = [spmd.process_rows(mesh, spec, n, dim=d) for d, n in enumerate(full.shape)]
    return full[np.ix_(*index)]


def _loader(args: dict) -> spmd.ProcessDataLoader:
    data = [torch.full((2,), float(i)) for i in range(args["dataset_size"])]
    made = spmd.ProcessDataLoader(
        data,
        args["global_batch"],
        MESHES[0],
        P("x"),
        seed=args["seed"],
        shuffle=args["shuffle"],
        drop_last=args["drop_last"],
    )
    made.load_state_dict({**made.state_dict(), "batch": args["batch"]})
    return made


def _one_process_batch(args: dict) -> torch.Tensor:
    sampler = spmd.ProcessSampler(
        args["dataset_size"], args["global_batch"], seed=args["seed"], shuffle=args["shuffle"], drop_last=True
    )
    order = sampler.order(0)[args["batch"] * args["global_batch"] :][: args["global_batch"]]
    return torch.stack([torch.full((2,), float(i)) for i in order])


def call(args: dict) -> bool:
    """Run the trial's surface with these arguments; whether the result is one process's."""
    surface, mesh, spec = args["surface"], args["mesh"], args["spec"]
    full = _full(args)
    if surface == "mark_sharding":
        return torch.equal(spmd.mark_sharding(full, mesh, spec).full_tensor(), full)
    if surface == "distribute_tensor":
        return torch.equal(spmd.distribute_tensor(full, mesh, spec).full_tensor(), full)
    if surface == "make_global_tensor":
        agreed = _full({**args, "rows": 8})
        local = _rows_of(*args.get("rows_layout", (mesh, spec)), agreed)
        local = local[: local.shape[0] * args["rows"] // 8]  # the odd rank passes fewer rows
        return torch.equal(spmd.make_global_tensor(local, mesh, spec).full_tensor(), agreed)
    return torch.equal(next(iter(_loader(args))).full_tensor(), _one_process_batch(args))


def run_trial(rank: int, trial: dict) -> dict:
    """This rank's verdict on one trial."""
    args = trial["other"] if trial["odd"] == rank else trial
    start = time.monotonic()
    try:
        outcome = {"result": "equal" if call(args) else "DIFFERENT"}
    except RankDisagreementError as e:
        outcome = {
            "error": type(e).__name__,
            "message": str(e),
            "fields": {k: sorted(v.values()) for k, v in e.fields.items()},
        }
    except Exception as e:  # any other error is a failure of the property
        outcome = {"error": type(e).__name__, "message": str(e)[:500]}
    outcome["seconds"] = time.monotonic() - start
    return outcome


def judge(trial: dict, verdicts: list[dict]) -> str:
    """'ok', or what broke the property."""
    if max(v["seconds"] for v in verdicts) > 30:
        return f"took {max(v['seconds'] for v in verdicts):.1f} s"
    if trial["odd"] is None:
        bad = [v for v in verdicts if v.get("result") != "equal"]
        return "ok" if not bad else f"agreeing ranks gave {bad[0]}"
    first = verdicts[0]
    if any((v.get("error"), v.get("message")) != (first.get("error"), first.get("message")) for v in verdicts):
        return f"ranks raised different errors: {[v.get('error') for v in verdicts]} {first.get('message', '')[:200]}"
    groups = first.get("fields", {}).get(trial["field"])
    if groups is None:
        return f"the error does not name {trial['field']!r}: {first}"
    if [trial["odd"]] not in groups:
        return f"the odd rank {trial['odd']} is not alone in its group: {groups}"
    return "ok"


def _label(trial: dict) -> str:
    mesh = trial["mesh"]
    where = f"{trial['surface']} {mesh.mesh_shape} ids {mesh.device_ids.tolist()} {trial['spec']!r} {trial['dtype']}"
    if trial["surface"] == "loader":
        where = "loader " + ", ".join(f"{k}={trial[k]}" for k in FIELDS["loader"])
    return where if trial["odd"] is None else f"{where}; rank {trial['odd']} differs in {trial['field']}"


def run_fuzz(out: Path, rank: int, seed: int, trials: int) -> None:
    for mesh in MESHES:  # built by all ranks alike now: building one is itself a collective
        spmd.device_mesh(mesh)
    rng = random.Random(seed)
    results = []
    for _ in range(trials):
        trial = draw(rng)
        dist.barrier()
        mine = run_trial(rank, trial)
        verdicts: list = [None] * dist.get_world_size()
        dist.all_gather_object(verdicts, mine)
        results.append({"trial": _label(trial), "verdict": judge(trial, verdicts), "odd": trial["odd"]})
    if rank == 0:
        (out / "fuzz.json").write_text(json.dumps(results))
