"""Healing HSDP: two replica groups of two ranks train one model, and a lost rank costs only its
group a restart: the other group goes on, and the restarted group fetches the weights and the
optimizer state from it (torchft; docs/reliability.md).

    python -m fsdp_xla.ft run --groups 2 --nproc-per-group 2 examples/train_heal.py --steps 300
    python examples/train_heal.py --steps 300             # the same: starts the lighthouse and groups
    torchrun --nproc_per_node 4 examples/train_heal.py --plain   # plain HSDP (data 2 x fsdp 2), no torchft

Each group is a torchrun job whose ranks are FSDP's shard axis (``fsdp``); the replicate axis is
the `fsdp_xla.ft.ReplicaGroup`, torchft's managed process group over the live groups. The task is
a student MLP fitting a fixed random teacher on fresh samples each step; the samples of a step
depend on (step, replica group, shard rank) only, so runs with and without failures see the same
data at the same step. ``--records DIR`` writes one JSON line per step and rank (for
benchmarks/chaos_heal.py and tests/fsdp_xla/test_heal.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import spmd
from fsdp_xla import FSDP, transformer_auto_wrap_policy
from fsdp_xla.checkpoint import has_checkpoint, load_sharded, save_sharded
from fsdp_xla.errors import FaultToleranceError, TorchftNotInstalledError
from mesh import ParallelDims

D, HIDDEN, BLOCKS, BATCH, LR = 64, 256, 4, 32, 2e-3


class Block(torch.nn.Module):
    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(D, hidden), torch.nn.Linear(hidden, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Student(torch.nn.Module):
    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(hidden) for _ in range(BLOCKS))
        self.head = torch.nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(seed: int, step: int, part: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples of data-parallel part ``part`` at ``step``, and the teacher's targets."""
    teacher = torch.Generator().manual_seed(seed)
    a = torch.randn(D, HIDDEN, generator=teacher) / D**0.5
    b = torch.randn(HIDDEN, D, generator=teacher) / HIDDEN**0.5
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + part)
    x = torch.randn(BATCH, D, generator=g)
    return x, torch.tanh(x @ a) @ b


def reference_losses(steps: int, seed: int = 0, parts: int = 4) -> list[float]:
    """The failure-free run in one process, no FSDP: each step's loss averaged over the ``parts``
    data-parallel parts (2 groups x 2 ranks), and one AdamW step on the gradient of that average,
    which is what HSDP's reduce-scatter and cross-group all-reduce compute."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs (torchrun's OMP_NUM_THREADS=1); 10x faster on a busy host
    try:
        torch.manual_seed(seed)
        model = Student()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        found = []
        for step in range(steps):
            parts_of_step = (batch(seed, step, p) for p in range(parts))
            loss = torch.stack([torch.nn.functional.mse_loss(model(x), y) for x, y in parts_of_step]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            found.append(loss.item())
        return found
    finally:
        torch.set_num_threads(threads)


def digest(model: torch.nn.Module) -> str:
    """This rank's shards of the weights, hashed: equal on the same rank of every replica group."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().to_local().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=positive, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="plain HSDP over all ranks, no torchft")
    parser.add_argument("--groups", type=positive, default=2, help="replica groups (--plain: the data axis)")
    parser.add_argument("--records", type=Path, help="directory for one JSON line per step and rank")
    parser.add_argument(
        "--checkpoint", type=Path, help="the fallback: each group saves to DIR/group<i>, resumes from it"
    )
    parser.add_argument("--save-every", type=positive, default=50, help="steps between checkpoints")
    parser.add_argument("--hidden", type=positive, default=HIDDEN, help="the student's width (a longer step)")
    parser.add_argument("--digest", action="store_true", help="record a hash of the weight shards each step")
    parser.add_argument(
        "--start-together",
        action="store_true",
        help="with --records: no group takes its first step before every group has joined the lighthouse "
        "(for a run compared with the failure-free one: else the group that starts first trains alone)",
    )
    parser.add_argument("--heartbeat-timeout", type=seconds, default=2.0, help="the lighthouse's, when started here")
    parser.add_argument("--timeout", type=seconds, default=10.0, help="cross-group collective timeout (s)")
    parser.add_argument(
        "--min-step-seconds", type=seconds, default=0.0, help="pad each step to this long: a larger model's compute"
    )
    args = parser.parse_args(argv)
    if args.start_together and args.records is None:
        parser.error("--start-together needs --records DIR: the groups mark their start there")
    return args


class Recorder:
    """One JSON line per event to ``DIR/replica{r}-rank{k}.jsonl``, appended across restarts."""

    def __init__(self, root: Path | None, replica: int, rank: int) -> None:
        self.file = None
        self.base = {"replica": replica, "rank": rank, "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))}
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
            self.file = open(root / f"replica{replica}-rank{rank}.jsonl", "a")  # noqa: SIM115

    def __call__(self, **fields: object) -> None:
        if self.file is not None:
            self.file.write(json.dumps({**self.base, **fields}) + "\n")
            self.file.flush()


def build(args: argparse.Namespace, replicate_axis: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(args.seed)  # every rank of every group starts from the same weights
    student = Student(args.hidden)
    if args.plain:
        mesh = ParallelDims(data=args.groups, fsdp=dist.get_world_size() // args.groups).mesh()
    else:
        mesh = ParallelDims(fsdp=dist.get_world_size()).mesh()
    policy = transformer_auto_wrap_policy({Block})
    model = FSDP(student, mesh=mesh, auto_wrap_policy=policy, replicate_axis=replicate_axis)
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def train_step(model, optimizer, x, y) -> float:
    optimizer.zero_grad()  # healing: joins this step's quorum
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # gradients: reduce-scatter in the group, then all-reduce across the replicas
    optimizer.step()  # healing: updates only if every live group committed the step
    return loss.item()


def run_plain(args: argparse.Namespace, record: Recorder) -> None:
    model, optimizer = build(args, None)
    for step in range(args.steps):
        t0 = time.time()
        loss = train_step(model, optimizer, *batch(args.seed, step, dist.get_rank()))
        record(step=step, committed=True, participants=args.groups, loss=loss, t0=t0, t1=time.time())


START_TOGETHER_SECONDS = 300.0  # a group's start (imports, rendezvous) took 13-27 s under load


def wait_for_every_group(records: Path, groups: int, replica: int) -> None:
    """Return once every replica group has built its `ReplicaGroup`: from then on each one
    heartbeats to the lighthouse, which holds the first quorum until all of them ask to join (a
    quorum of one met at once while another group was still importing torch). Each group's rank 0
    marks its start in ``records``; a group restarted later finds the others' marks and goes on."""
    if dist.get_rank() == 0:
        (records / f"ready-replica{replica}").touch()
    deadline = time.monotonic() + START_TOGETHER_SECONDS
    while missing := [r for r in range(groups) if not (records / f"ready-replica{r}").exists()]:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"--start-together: replica groups {missing} of {groups} did not start within "
                f"{START_TOGETHER_SECONDS:.0f} s; see each group's log"
            )
        time.sleep(0.1)


def run_healing(args: argparse.Namespace, record: Recorder, replica: int) -> None:
    from fsdp_xla import ft

    # init_sync off: every group builds the same weights from --seed, so step 0 averages all of them
    # (with it on, the groups but one take the first's weights at step 0 and add no gradient to it).
    lighthouse = os.environ["TORCHFT_LIGHTHOUSE"]
    group = ft.ReplicaGroup(lighthouse=lighthouse, replica_id=replica, timeout=args.timeout, init_sync=False)
    model, inner = build(args, group)
    saves = args.checkpoint / f"group{replica}" if args.checkpoint is not None else None
    if saves is not None and has_checkpoint(saves):  # the fallback: every group was lost at once
        group.load_state_dict(load_sharded(saves, model, inner)["replicas"])
    optimizer = group.optimizer(inner, model)
    if args.start_together:
        wait_for_every_group(args.records, args.groups, replica)
    part = replica * dist.get_world_size() + dist.get_rank()
    try:
        while (step := group.step) < args.steps:
            t0 = time.time()
            loss = train_step(model, optimizer, *batch(args.seed, step, part))
            time.sleep(max(0.0, t0 + args.min_step_seconds - time.time()))
            fields = {"participants": group.participants, "healing": not group.is_participating()}
            fields["digest"] = digest(model) if args.digest else None
            # a replacement's first step starts at 0 and ends at the live group's step (it healed
            # in between): the step committed is the one before the count's new value
            committed = group.step > step
            step = group.step - 1 if committed else step
            record(step=step, committed=committed, loss=loss, t0=t0, t1=time.time(), **fields)
            if saves is not None and committed and group.step % args.save_every == 0:
                save_sharded(saves, model, inner, extra={"replicas": group.state_dict()})
    finally:
        group.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if "WORLD_SIZE" not in os.environ:  # a plain `python examples/train_heal.py`: start the whole run
        command = [sys.executable, "-m", "fsdp_xla.ft", "run", "--groups", str(args.groups)]
        command += ["--heartbeat-timeout", str(args.heartbeat_timeout), __file__, *(argv or sys.argv[1:])]
        return subprocess.call(command)
    missing = [k for k in ("TORCHFT_LIGHTHOUSE", "REPLICA_GROUP_ID") if k not in os.environ]
    if missing and not args.plain:
        print(
            f"train_heal.py: {' and '.join(missing)} not set: run `python examples/train_heal.py` (or `python -m "
            "fsdp_xla.ft run ...`), which starts the lighthouse and the groups, or set them for each group's torchrun "
            "(docs/reliability.md); --plain for HSDP without torchft.",
            file=sys.stderr,
        )
        return 2
    spmd.init_process_group("gloo", timeout=60)  # a prefix per torchrun attempt: restarts can rendezvous
    replica = 0 if args.plain else int(os.environ["REPLICA_GROUP_ID"])
    record = Recorder(args.records, replica, dist.get_rank())
    record(event="start", pid=os.getpid(), t=time.time())
    try:
        if args.plain:
            run_plain(args, record)
        else:
            run_healing(args, record, replica)
    except (TorchftNotInstalledError, FaultToleranceError) as e:  # one line, not a traceback per rank
        print(f"train_heal.py: {e}", file=sys.stderr)
        return 2
    record(event="done", t=time.time())
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
