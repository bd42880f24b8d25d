"""Bad input gets a typed error naming what to change, never a crash, hang or silent wrong value
(issue: no silent failures). Each case here was reproduced as a crash, a raw traceback or a
silent wrong value before its fix."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from fsdp_xla import FSDPTypeError, MixedPrecision
from mesh import DeviceCountError, Mesh, MeshError
from spmd import NamedSharding, P, ShardingSpec, SpmdTypeError, configure_default_devices, mark_sharding
from tests.torchrun import ROOT, child_env

MESH = Mesh(np.arange(8), (8,), ("data",))


@pytest.mark.parametrize("count", [0, -2, True, "8", 10**6])
def test_a_device_count_that_would_crash_torch_xla_is_refused(count):
    with pytest.raises(DeviceCountError, match="from 1 to 4096"):
        configure_default_devices(count)  # torch_xla took 0 and segfaulted at the first device use


def test_error_messages_stay_short_for_huge_device_lists():
    with pytest.raises(MeshError) as e:
        Mesh(np.arange(100_000), (7,), ("a",))
    assert len(str(e.value)) < 400 and "99984 more, 100000 in all" in str(e.value)  # was 689,017 characters


@pytest.mark.parametrize("name", ["", "a b", "1st", "x-y"])
def test_axis_names_are_identifiers(name):
    with pytest.raises(MeshError, match="give a non-empty identifier"):
        Mesh(np.arange(8), (8,), (name,))


def test_swapped_mesh_and_spec_are_named():
    with pytest.raises(SpmdTypeError, match=r"the mesh and the spec are swapped; the order is mark_sharding\(t, mesh"):
        mark_sharding(torch.zeros(8), P("data"), MESH)
    with pytest.raises(TypeError, match="swapped; the order is NamedSharding"):
        NamedSharding(P("data"), MESH)
    with pytest.raises(TypeError, match="swapped; the order is ShardingSpec"):
        ShardingSpec(("data",), MESH)


def test_boolean_options_take_bools_only():
    with pytest.raises(FSDPTypeError, match="cast_inputs must be True or False, got 'no'"):
        MixedPrecision(torch.bfloat16, cast_inputs="no")  # 'no' is truthy: it turned casting on


def inspector(*args, cwd=ROOT):
    command = [sys.executable, "-m", "spmd.inspector", *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--devices", "0"], "argument --devices: 0 is out of range"),
        (["--devices", "-2"], "argument --devices: -2 is out of range"),
        (["--devices", "9" * 30], "is too large: give a whole number from 1 to"),
        (["--steps", "0"], "argument --steps: 0 is out of range"),
        (["--threshold", "nan"], "argument --threshold: 'nan' is not a whole number"),
        (["--json", "/proc/report.json"], "cannot create files in the directory /proc"),
        (["--dump-dir", "/proc/dumps"], "cannot create files in the directory /proc"),
    ],
)
def test_inspector_flags_are_checked_when_parsed(tmp_path, flags, message, capsys, monkeypatch):
    """The CLI's parser (its `main` parses first), in this process: parsing runs no script and
    configures no device, so a process of its own for each flag (3 to 5 s of imports, 7 times a
    lane) added nothing; the test below starts the program and checks its exit code."""
    from spmd.inspector.cli import build_parser

    script = tmp_path / "script.py"
    script.write_text("open('ran', 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:  # --devices 0 / -2 segfaulted with no output
        build_parser().parse_args([*flags, str(script)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("error:") == 1, err
    assert not (tmp_path / "ran").exists()


def test_inspector_refuses_a_directory_as_json_before_running_the_script(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("open('ran', 'w').close()\n")
    run = inspector("--json", tmp_path, script, cwd=tmp_path)  # the whole script ran, then the report was lost
    assert run.returncode == 2 and "is a directory; give a file path" in run.stderr
    assert not (tmp_path / "ran").exists()


def test_messages_of_the_tensor_verbs_name_the_fix():
    from spmd.compat import shard_as

    with pytest.raises(SpmdTypeError, match=r"got list; pass the tensor itself \(torch.as_tensor"):
        mark_sharding([1.0, 2.0], MESH, P("data"))
    with pytest.raises(SpmdTypeError, match=r"(?s)one structure, got .*; pair the tensors alike in both"):
        shard_as([torch.zeros(2)], (torch.zeros(2), torch.zeros(2)))


XLA_ONLY = pytest.mark.torch_xla  # these benchmarks exit with "needs torch_xla" before parsing on the current lane


@pytest.mark.parametrize(
    "script, flags, said",
    [
        ("agreement_cost", ["--calls", "0"], "argument --calls: must be at least 1, got 0"),
        ("dtensor_fsdp_overhead", ["--layers", "-1"], "argument --layers: must be at least 1, got -1"),
        ("hf_trainer_memory", ["--nproc", "1.5"], "argument --nproc: expected a whole number, got '1.5'"),
        ("kill_ranks", ["--save-every", "0"], "argument --save-every: must be at least 1, got 0"),
        ("kill_ranks", ["--jitter", "nan"], "argument --jitter: must be a finite number of at least 0, got nan"),
        ("kill_ranks", ["--timeout", "-5"], "argument --timeout: must be a finite number above 0, got -5"),
        ("plan_advise_time", ["--jobs", "0"], "argument --jobs: must be at least 1, got 0"),
        ("stopped_rank_repeat", ["--runs", "9" * 30], "argument --runs: must be at most 2147483647"),
        pytest.param("fsdp_soak", ["--rss-tolerance", "-0.1"], "argument --rss-tolerance: must be", marks=XLA_ONLY),
        pytest.param("fsdp_memory", ["--steps", "0"], "argument --steps: must be at least 1, got 0", marks=XLA_ONLY),
        pytest.param(
            "rendezvous_abort", ["--nice", "-5"], "argument --nice: must be at least 0, got -5", marks=XLA_ONLY
        ),
        pytest.param(
            "deferred_init_memory", ["--eager-limit", "inf"], "argument --eager-limit: must be", marks=XLA_ONLY
        ),
        pytest.param("replace_recompiles", ["--steps", "-1"], "argument --steps: must be at least 1", marks=XLA_ONLY),
        pytest.param(
            "sharded_tensor_tracing", ["--repeats", "0"], "argument --repeats: must be at least 1", marks=XLA_ONLY
        ),
    ],
)
def test_benchmark_number_flags_are_checked_when_parsed(script, flags, said, monkeypatch, capsys):
    """Every benchmark's number flags are checked as documented (a negative --steps or a NaN
    --timeout ran, or failed later inside torch), in argparse's one line."""
    import runpy

    monkeypatch.setattr(sys, "argv", [f"{script}.py", *flags])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "benchmarks" / f"{script}.py"), run_name="__main__")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert said in err and err.count("error:") == 1, err


def _module_as_specs():
    from spmd import shard_parameters

    shard_parameters(torch.nn.Linear(8, 8), MESH, torch.nn.Linear(2, 2))


def _one_argument_spec_function():
    from spmd import shard_parameters

    shard_parameters(torch.nn.Linear(8, 8), MESH, lambda name: None)


@pytest.mark.parametrize(
    "call, error, said",
    [
        (
            lambda: __import__("spmd").spec_from_placements([], MESH, 1, by_index="yes"),
            SpmdTypeError,
            "spec_from_placements: by_index must be True or False, got 'yes'",
        ),
        (_module_as_specs, SpmdTypeError, "specs is a module (Linear); the order is shard_parameters(module, mesh"),
        (_one_argument_spec_function, SpmdTypeError, "must take two arguments (name, parameter)"),
        (
            lambda: __import__("spmd").ProcessDataLoader(None, 8, MESH, P("data")),
            SpmdTypeError,
            "dataset must be a map-style dataset (len(dataset) and dataset[i]), got NoneType",
        ),
        (
            lambda: __import__("spmd").make_global_tensor(np.zeros((8, 2), dtype=object), MESH, P("data")),
            SpmdTypeError,
            "a numpy array of dtype object has no torch dtype",
        ),
        (
            lambda: __import__("spmd").make_global_batch({1: torch.zeros(8), "x": torch.zeros(8)}, MESH, P("data")),
            SpmdTypeError,
            "batch keys must be strings (names of the batch's fields), got 1 (int)",
        ),
        (lambda: __import__("mesh").get_1d_mesh("x", 2**70), DeviceCountError, "num_devices must be an int from 1 to"),
        (lambda: __import__("mesh").get_1d_mesh("x", 0), DeviceCountError, "num_devices must be an int from 1 to"),
    ],
)
def test_api_arguments_that_reached_python_or_a_dependency(call, error, said):
    """Each raised a dependency's or Python's own error (numpy's "Maximum allowed size exceeded",
    torch's "can't convert np.ndarray of type numpy.object_", "object of type 'NoneType' has no
    len()", a module's forward called as a spec function) or took 'yes' as True (issue 36)."""
    import re

    with pytest.raises(error, match=re.escape(said)):
        call()


@pytest.fixture(scope="module")
def lone_refusals(tmp_path_factory):
    import json

    from tests.torchrun import WORKERS, warm_launch

    out = tmp_path_factory.mktemp("lone_refusals")
    run = warm_launch(WORKERS / "lone_refusal_worker.py", 2, str(out), timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize(
    "case",
    [
        "check_no_on_one_rank",
        "list_on_one_rank",
        "int_key_on_one_rank",
        # constructors with no collective of their own: the other rank failed at its next collective
        # (the attention's gather, FSDP's agreement) only after the process group's timeout
        "context_parallel_strategy_on_one_rank",
        "fsdp_axis_on_one_rank",
    ],
)
def test_an_argument_refused_on_one_rank_fails_every_rank_at_once(lone_refusals, case):
    """The refusing rank raised before the ranks' exchange and the others waited in it until the
    timeout, then got gloo's raw "Timed out waiting 12000ms" (issue 36): now it takes part in the
    exchange and every rank raises the same RankDisagreementError, naming its refusal, at once."""
    (kind0, said0, took0), (kind1, said1, took1) = (r[case] for r in lone_refusals)
    assert kind0 == kind1 == "RankDisagreementError" and said0 == said1, (said0, said1)
    assert "arguments:" in said0 and "refused (" in said0 and max(took0, took1) < 15


def test_context_parallel_plans_that_differ_between_ranks_are_refused_on_every_rank(lone_refusals):
    """load_balance True on one rank and False on the other was accepted, and the ranks then split
    the sequence in different orders: a wrong result, silently."""
    (kind0, said0, _), (kind1, said1, _) = (r["context_parallel_load_balance_differs"] for r in lone_refusals)
    assert kind0 == kind1 == "RankDisagreementError" and said0 == said1 and "load_balance" in said0


def test_an_argument_refused_on_every_rank_is_the_type_error(lone_refusals):
    assert [r["check_no_on_every_rank"][0] for r in lone_refusals] == ["SpmdTypeError"] * 2


@pytest.mark.parametrize(
    "case, kind, said",
    [
        ("init_twice", "ProcessGroupError", "already has its process group (gloo, rank"),
        ("init_unknown_keyword", "SpmdTypeError", "got ['bogus'], which torch.distributed.init_process_group does not"),
    ],
)
def test_init_process_group_refusals_are_ours(lone_refusals, case, kind, said):
    """torch's own ValueError ("trying to initialize the default process group twice!") and
    TypeError (an unexpected keyword, from inside torch) before."""
    for r in lone_refusals:
        assert r[case][0] == kind and said in r[case][1], r[case]


def test_a_plain_model_saved_by_every_rank_names_the_likely_cause(lone_refusals):
    """A model without DTensors is saved whole by each rank; the rank whose save came second was
    told another run's checkpoint was there, with no hint that the other run was its sibling."""
    outcomes = sorted(r["plain_model_saved_by_every_rank"][0] for r in lone_refusals)
    assert outcomes == ["CheckpointError", "ok"]
    said = next(
        r["plain_model_saved_by_every_rank"][1] for r in lone_refusals if r["plain_model_saved_by_every_rank"][1]
    )
    assert "another rank of this job" in said and "if dist.get_rank() == 0" in said


def test_fsdp_of_a_model_that_differs_on_one_rank_is_refused_on_every_rank(lone_refusals):
    """Each rank sharded its own shapes and the first all-gather aborted the process (gloo's
    "Connection reset by peer" on the other): now one exchange before anything is sharded."""
    (kind0, said0, _), (kind1, said1, _) = (r["fsdp_of_another_model_on_one_rank"] for r in lone_refusals)
    assert kind0 == kind1 == "RankDisagreementError" and said0 == said1
    assert "parameters: rank 0 0.weight (4, 4)" in said0 and "rank 1 0.weight (6, 4)" in said0


def test_fsdp_agrees_on_its_arguments_and_the_model_in_one_exchange(lone_refusals):
    """The arguments and the model were agreed in two exchanges (two collectives per wrap)."""
    assert [r["exchanges_to_wrap"][0] for r in lone_refusals] == [1, 1]
