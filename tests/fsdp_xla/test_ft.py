"""Healing HSDP (fsdp_xla.ft) short of a run: the replicate dim given as a `ReplicaSync`, the
refusals (a replicate axis left inside the group's mesh, the GSPMD engine, bad arguments, a busy
port, torchft missing), the CLI, and in one process what a replacement receives (`ShardState`)
and where FSDP calls the replicas' hook. The run itself, with kills: test_ft_chaos.py."""

import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import fsdp_xla
from fsdp_xla import (
    FaultToleranceError,
    FSDPError,
    FSDPOptions,
    FSDPTypeError,
    MeshAxisError,
    TorchftNotInstalledError,
    ft,
)
from fsdp_xla._gspmd import GspmdFSDP
from fsdp_xla._replicas import ReplicaSync
from mesh import Mesh
from tests.torchrun import ROOT, WORKERS, child_env

HAS_TORCHFT = __import__("importlib").util.find_spec("torchft") is not None
needs_torchft = pytest.mark.skipif(not HAS_TORCHFT, reason="torchft is not installed (the extra xla-spmd[ft])")


class Sync(ReplicaSync):
    def all_reduce_hook(self):
        return lambda shard: None

    def describe(self):
        return "Sync(2 groups)"


def mesh(*axes):
    names, shape = tuple(a for a, _ in axes), tuple(n for _, n in axes)
    return Mesh(np.arange(int(np.prod(shape))), shape, names)


def test_a_replica_sync_is_the_replicate_dim_and_the_mesh_only_shards():
    sync = Sync()
    options = FSDPOptions(mesh=mesh(("fsdp", 4)), replicate_axis=sync)
    assert options.replicate_sync is sync
    assert options.replicate_axes == () and options.shard_axes == ("fsdp",)
    # a data axis of size 1 holds no copies: nothing for the sync to miss
    assert FSDPOptions(mesh=mesh(("data", 1), ("fsdp", 4)), replicate_axis=sync).replicate_sync is sync
    assert FSDPOptions(mesh=mesh(("fsdp", 4))).replicate_sync is None  # off by default


def test_a_replicate_axis_left_inside_the_group_is_refused():
    with pytest.raises(
        MeshAxisError, match=r"replicate axis 'data' of size 2 inside the group .*ParallelDims\(fsdp=n\)"
    ):
        FSDPOptions(mesh=mesh(("data", 2), ("fsdp", 2)), replicate_axis=Sync())
    # sharded over it instead: no copies inside the group
    options = FSDPOptions(mesh=mesh(("data", 2), ("fsdp", 2)), fsdp_axis=("data", "fsdp"), replicate_axis=Sync())
    assert options.shard_axes == ("data", "fsdp")


def test_the_gspmd_engine_refuses_healing_before_it_touches_the_model():
    model = torch.nn.Linear(4, 4)
    before = [p.detach().clone() for p in model.parameters()]
    options = FSDPOptions(mesh=mesh(("fsdp", 4)), replicate_axis=Sync())
    with pytest.raises(FaultToleranceError, match=r"dtensor backend only .*xla-spmd\[current,ft\].*save_sharded"):
        GspmdFSDP().check(model, options)
    assert isinstance(FaultToleranceError("x"), FSDPError)
    assert all(type(p) is torch.nn.Parameter and torch.equal(p, b) for p, b in zip(model.parameters(), before))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"replica_id": -1}, FSDPError, "replica_id must be an int >= 0, got -1"),
        ({"replica_id": True}, FSDPTypeError, "replica_id must be an int >= 0, got True"),
        ({"replica_id": "0"}, FSDPTypeError, "replica_id must be an int >= 0"),
        ({"replica_id": 0, "min_replicas": 0}, FSDPError, "min_replicas must be an int >= 1, got 0"),
        ({"replica_id": 0, "timeout": 0}, FSDPError, r"timeout \(seconds\) must be finite and > 0"),
        ({"replica_id": 0, "quorum_timeout": float("nan")}, FSDPError, "quorum_timeout"),
        ({"replica_id": 0, "init_sync": "no"}, FSDPTypeError, "init_sync must be True or False"),
        ({"replica_id": 0, "lighthouse": ""}, FSDPTypeError, "lighthouse .* must be a non-empty string"),
        ({"replica_id": 0}, FaultToleranceError, r"torch.distributed is not initialized.*init_process_group"),
    ],
)
def test_replica_group_arguments_are_checked_before_anything_starts(kwargs, error, message):
    with pytest.raises(error, match=message):
        ft.ReplicaGroup(**{"lighthouse": "http://localhost:29510", **kwargs})


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"min_replicas": 0}, FSDPError, "min_replicas must be an int >= 1, got 0"),
        ({"min_replicas": 1.0}, FSDPTypeError, "min_replicas must be an int >= 1"),
        ({"heartbeat_timeout": -1}, FSDPError, r"heartbeat_timeout \(seconds\) must be finite and > 0"),
        ({"join_timeout": "60"}, FSDPTypeError, "join_timeout .* must be a real number"),
        ({"bind": 29510}, FSDPTypeError, "bind .* must be a non-empty string"),
    ],
)
def test_lighthouse_arguments_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        ft.Lighthouse(**kwargs)


def test_launch_groups_checks_its_counts_and_script(tmp_path):
    with pytest.raises(FSDPError, match="groups must be an int >= 1, got 0"):
        ft.launch_groups(tmp_path / "x.py", lighthouse="http://h:1", groups=0, nproc_per_group=2)
    with pytest.raises(FSDPTypeError, match="nproc_per_group must be an int >= 1"):
        ft.launch_groups(tmp_path / "x.py", lighthouse="http://h:1", groups=2, nproc_per_group=2.0)
    with pytest.raises(FSDPError, match="x.py' is not a file"):
        ft.launch_groups(tmp_path / "x.py", lighthouse="http://h:1", groups=2, nproc_per_group=2)


def test_without_torchft_the_error_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "torchft" or m.startswith("torchft.")] + ["torchft"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "torchft._torchft", None)
    with pytest.raises(TorchftNotInstalledError, match=r"needs torchft.*pip install 'xla-spmd\[ft\]'") as caught:
        ft.Lighthouse(bind="[::]:0")
    assert isinstance(caught.value, ModuleNotFoundError)  # what `import torchft` raises, caught the same way


@needs_torchft
def test_a_busy_port_is_a_fault_tolerance_error_naming_the_fix():
    with ft.Lighthouse(bind="[::]:0") as first:
        port = first.address.rsplit(":", 1)[1]
        with pytest.raises(FaultToleranceError, match=rf"bind='\[::\]:{port}'.*in use.*'\[::\]:0'"):
            ft.Lighthouse(bind=f"[::]:{port}")


def _cli(*args, timeout=60):
    env = child_env(xla=False)
    env["RUST_LOG"] = "warn"
    return subprocess.run(
        [sys.executable, "-m", "fsdp_xla.ft", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--groups", "0", "x.py"], "--groups: must be an int >= 1, got '0'"),
        (["lighthouse", "--heartbeat-timeout", "-2"], "--heartbeat-timeout: must be a number of seconds > 0"),
    ],
)
def test_the_cli_refuses_a_bad_flag_in_one_line(args, message, capsys):
    """argparse's own refusals, in this process: they come before the lighthouse and the signal
    handlers, so a process of its own (4 s of importing torch, 13-20 s under the suite's load)
    would add nothing; the program's exit code is checked by the test below, which starts it."""
    from fsdp_xla.ft.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("python -m fsdp_xla.ft ") and message in err, err


def test_the_cli_refuses_a_missing_script_in_one_line():
    """As a program: the lighthouse starts first, then the refusal is one line and exit code 2."""
    message = "script='no_such_script.py' is not a file" if HAS_TORCHFT else r"needs torchft.*xla-spmd\[ft\]"
    run = _cli("run", "no_such_script.py")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert __import__("re").search(message, run.stderr), run.stderr


@needs_torchft
def test_the_cli_serves_a_lighthouse_until_told_to_stop():
    env = child_env(xla=False)
    env["RUST_LOG"] = "warn"
    command = [sys.executable, "-m", "fsdp_xla.ft", "lighthouse", "--bind", "[::]:0"]
    p = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:  # never leave it serving: a `with Popen` would wait for it forever
        if p.poll() is None:
            p.kill()
        p.communicate()
    assert line.startswith("lighthouse at http://") and "(min_replicas=1)" in line


def test_a_replacement_takes_the_shards_and_optimizer_state_and_fsdp_calls_the_hook(tmp_path):
    env = child_env(xla=False)
    env["USE_TORCH_XLA"] = "0"
    out = tmp_path / "state.json"
    run = subprocess.run(
        [sys.executable, str(WORKERS / "ft_state_worker.py"), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["hook_calls"] == 3  # two Blocks and the root: one reduce-scattered shard each
    assert result["hook_scales"]  # the hook zeroed them: the optimizer sees what the replicas made of them
    assert result["transfer"]  # the replacement's next step equals its peer's, bit for bit
    assert not result["without_optimizer"]  # the weights alone would not do: Adam's moments differ


def test_fsdp_on_the_torch_xla_lane_refuses_a_replica_group(xla):
    from tests.fsdp_xla.helpers import fsdp_mesh

    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.raises(FaultToleranceError, match=r"healing HSDP \(torchft\) runs on the dtensor backend only"):
        fsdp_xla.FSDP(model, mesh=fsdp_mesh(8), replicate_axis=Sync())
    assert all(type(p) is torch.nn.Parameter and p.device.type == "cpu" for p in model.parameters())


@pytest.mark.parametrize(
    "state, message",
    [
        ({"step": 3}, "a dict with 'step' and 'batches_committed', got"),
        ([3, 6], "a dict with 'step' and 'batches_committed', got"),
        ({"step": -1, "batches_committed": 0}, "step must be an int >= 0, got -1"),
        ({"step": 1.5, "batches_committed": 0}, "step must be an int >= 0, got 1.5"),
    ],
)
def test_a_replica_group_takes_back_only_the_step_count_it_saved(state, message):
    group = object.__new__(ft.ReplicaGroup)  # the check comes before torchft's manager is touched
    with pytest.raises(FSDPTypeError, match=message):
        group.load_state_dict(state)


def _refused_example_run(tmp_path, env) -> subprocess.CompletedProcess:
    """examples/train_heal.py run with ``env``; it must refuse (exit 2) without a traceback."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_heal.py"), "--steps", "2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    return run


@pytest.mark.skipif(HAS_TORCHFT, reason="checks a host without torchft (the torch_xla lane's venv)")
def test_without_torchft_the_example_says_so_in_one_line(tmp_path):
    run = _refused_example_run(tmp_path, child_env(xla=False))
    assert len(run.stderr.strip().splitlines()) == 1 and "pip install 'xla-spmd[ft]'" in run.stderr, run.stderr


def test_the_example_under_a_bare_torchrun_says_what_to_set(tmp_path):
    env = {k: v for k, v in child_env(xla=False).items() if k not in ("TORCHFT_LIGHTHOUSE", "REPLICA_GROUP_ID")}
    env["WORLD_SIZE"] = "1"  # as torchrun sets it
    run = _refused_example_run(tmp_path, env)
    assert "TORCHFT_LIGHTHOUSE and REPLICA_GROUP_ID not set" in run.stderr


class FakeManager:
    """The part of torchft's Manager the all-reduce hook reads, for one step's quorum."""

    def __init__(self, participants=2, participating=True, errored=None):
        self.participants, self.participating, self.error, self.reported = participants, participating, errored, []

    def num_participants(self):
        return self.participants

    def is_participating(self):
        return self.participating

    def errored(self):
        return self.error

    def report_error(self, e):
        self.reported.append(e)


class FakeCrossGroup:
    """The reconfigurable process group: the peer group's shard is ``peer``; records what was sent."""

    def __init__(self, peer, fail=None):
        self.peer, self.fail, self.sent = peer, fail, []

    def allreduce(self, tensors, options):
        assert options.reduceOp == torch.distributed.ReduceOp.SUM
        self.sent.append(tensors[0].clone())
        if self.fail is not None:
            raise self.fail
        tensors[0].add_(self.peer)
        return self

    def wait(self):
        return True


@pytest.mark.parametrize(
    "manager, sent, result",
    [
        (FakeManager(), [1.0, 2.0], [2.0, 3.0]),  # (own + peer's) / 2 participants
        (FakeManager(participating=False), [0.0, 0.0], [1.5, 2.0]),  # healing: zeros sent, the peer's average
        (FakeManager(participants=3), [1.0, 2.0], [4 / 3, 2.0]),  # divided by the quorum's count
    ],
)
def test_the_hook_averages_a_shard_over_the_live_groups_on_the_process_group_itself(manager, sent, result):
    from fsdp_xla.ft._group import average_over_live_groups

    group = FakeCrossGroup(peer=torch.tensor([3.0, 4.0]))
    shard = torch.tensor([1.0, 2.0])
    average_over_live_groups(manager, group)(shard)
    assert [t.tolist() for t in group.sent] == [sent]  # one all-reduce, no wrapper (torchft's Manager.allreduce)
    assert shard.tolist() == pytest.approx(result)
    assert manager.reported == []


def test_a_failed_cross_group_all_reduce_drops_the_step_and_an_errored_step_sends_nothing():
    from fsdp_xla.ft._group import average_over_live_groups

    lost = RuntimeError("Connection closed by peer")
    manager, group = FakeManager(), FakeCrossGroup(peer=torch.ones(2), fail=lost)
    average_over_live_groups(manager, group)(torch.ones(2))
    assert manager.reported == [lost]  # should_commit then says no on every rank of the group
    errored, group = FakeManager(errored=lost), FakeCrossGroup(peer=torch.ones(2))
    shard = torch.ones(2)
    average_over_live_groups(errored, group)(shard)
    assert group.sent == [] and shard.tolist() == [1.0, 1.0] and errored.reported == []
