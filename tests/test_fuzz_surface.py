"""Fuzz campaign over the rest of the public surface: placements, DTensor-style entry points,
FSDP options and wrap policies, data-loader specs, checkpoints (arguments and damaged files) and
every flag of the command lines. Every outcome is a correct result or one of our typed errors
with a message; each test runs under a time bound (a hang fails it, SIGALRM), derandomized.
Run with ``-s`` for the case counts.
"""

import argparse
import contextlib
import copy
import json
import math
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import Partial, Replicate, Shard

import fsdp_xla.checkpoint as ck
from fsdp_xla import (
    CheckpointError,
    MixedPrecision,
    SizeWrapPolicy,
    TransformerWrapPolicy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
from mesh import Mesh
from spmd import P, PartitionSpec, ShardingSpec, hlo_sharding_for, placements_from_spec, spec_from_placements
from tests.test_fuzz_api import COUNTS, OUTCOMES, junk, outcome, report_counts  # noqa: F401 (the module fixture prints counts)

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
MESHES = [Mesh(np.arange(8), (8,), ("data",)), Mesh(np.arange(8), (2, 4), ("data", "model"))]


@contextlib.contextmanager
def time_bound(seconds: int):
    """Fail instead of hanging: SIGALRM after ``seconds``."""

    def expired(signum, frame):
        raise TimeoutError(f"no outcome within {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


placement = st.one_of(
    st.builds(Shard, st.integers(-4, 4)),
    st.just(Replicate()),
    st.just(Partial()),
    junk,
)


@st.composite
def mesh_and_placements(draw):
    """Half of them one Shard/Replicate per mesh axis (so the round trip is exercised), the rest anything."""
    mesh = draw(st.sampled_from(MESHES))
    well_formed = st.lists(
        st.one_of(st.builds(Shard, st.integers(-3, 2)), st.just(Replicate())), min_size=mesh.ndim, max_size=mesh.ndim
    )
    return mesh, draw(st.one_of(well_formed, st.lists(placement, max_size=3)))


@FUZZ
@given(mesh_placements=mesh_and_placements(), rank=st.integers(0, 3))
def test_spec_from_placements(mesh_placements, rank):
    mesh, placements = mesh_placements

    def check(spec):  # round trip: the spec's placements are the ones given (a negative dim counted from the end)
        given = tuple(Shard(p.dim % rank) if isinstance(p, Shard) else p for p in placements)
        assert placements_from_spec(spec, mesh, rank) == given

    with time_bound(10):
        outcome("spec_from_placements", lambda: spec_from_placements(placements, mesh, rank), check, params=("rank",))


@FUZZ
@given(
    mesh=st.sampled_from(MESHES),
    entries=st.lists(st.one_of(st.none(), st.sampled_from(["data", "model"]), junk), max_size=4),
    rank=st.integers(-1, 4),
)
def test_placements_from_spec(mesh, entries, rank):
    def check(placements):  # round trip: the placements lay the tensor out as the spec does
        assert len(placements) == mesh.ndim
        back = spec_from_placements(placements, mesh, rank)
        assert hlo_sharding_for(mesh, back, rank) == hlo_sharding_for(mesh, P(*entries), rank)

    with time_bound(10):
        outcome("placements_from_spec", lambda: placements_from_spec(P(*entries), mesh, rank), check)


@FUZZ
@given(
    compute=st.one_of(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.int8]), junk),
    buffer=st.one_of(st.none(), st.sampled_from([torch.bfloat16, torch.int32]), junk),
    cast=st.one_of(st.booleans(), junk),
)
def test_mixed_precision(compute, buffer, cast):
    def check(mp):
        assert isinstance(mp.cast_inputs, bool) and mp.compute_dtype.is_floating_point

    with time_bound(10):
        outcome("MixedPrecision", lambda: MixedPrecision(compute, buffer, cast_inputs=cast), check)


@FUZZ
@given(classes=st.one_of(junk, st.sets(st.sampled_from([torch.nn.Linear, torch.nn.LayerNorm])), st.just({"Block"})))
def test_transformer_wrap_policy(classes):
    def check(policy):  # exactly the classes given are units
        assert isinstance(policy, TransformerWrapPolicy) and policy.layer_classes == frozenset(classes)
        for module in (torch.nn.Linear(2, 2), torch.nn.LayerNorm(2), torch.nn.ReLU()):
            assert policy.should_wrap(module, 0) == (type(module) in classes)

    with time_bound(10):
        outcome("transformer policy", lambda: transformer_auto_wrap_policy(classes), check, params=("layer_classes",))


@FUZZ
@given(min_params=junk)
def test_size_wrap_policy(min_params):
    def check(policy):  # the threshold is the number given, and it is the threshold
        assert isinstance(policy, SizeWrapPolicy) and type(policy.min_num_params) is int
        assert policy.min_num_params == min_params >= 1
        assert policy.should_wrap(torch.nn.Linear(2, 2), min_params) and not policy.should_wrap(
            torch.nn.Linear(2, 2), min_params - 1
        )

    with time_bound(10):
        outcome("size policy", lambda: size_based_auto_wrap_policy(min_params), check)


@FUZZ
@given(
    mesh=st.one_of(st.sampled_from(MESHES), st.sampled_from(MESHES), junk),
    entries=st.one_of(
        st.lists(st.one_of(st.none(), st.sampled_from(["data", "model"])), max_size=2),
        st.lists(st.one_of(st.none(), st.sampled_from(["data", "model", "x"]), junk), max_size=3),
        junk,
    ),
    minibatch=st.one_of(st.booleans(), st.booleans(), junk),
)
def test_sharding_spec(mesh, entries, minibatch):
    def check(spec):  # what was given, read as mark_sharding reads a spec
        assert spec.mesh is mesh and spec.minibatch is minibatch
        assert spec.partition_spec == PartitionSpec.from_value(entries)
        hlo_sharding_for(mesh, spec.partition_spec, len(spec.partition_spec))  # it fits the mesh

    with time_bound(10):
        outcome("ShardingSpec", lambda: ShardingSpec(mesh, entries, minibatch), check)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))


@FUZZ
@given(path=junk, keep=junk, extra=st.one_of(junk, st.just({"step": torch.ones(1)})))
def test_save_sharded_arguments(tmp_path_factory, path, keep, extra):
    """A save that succeeds loads back: the same weights and the same ``extra``."""
    target = tmp_path_factory.mktemp("save")

    def loads_back(root, extra=None):
        def check(version):
            model = _model(1)
            assert version.parent == Path(root).absolute() or version.parent.resolve() == Path(root).resolve()
            assert ck.load_sharded(root, model) == (extra or {})
            assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), _model(0).state_dict().values()))

        return check

    with time_bound(20), contextlib.chdir(target):  # a relative path lands in the temp dir
        outcome(
            "save_sharded args",
            lambda: ck.save_sharded(target / "ck", _model(0), keep=keep, extra=extra),
            loads_back(target / "ck", extra),
            params=("keep", "extra"),
        )
        outcome("save_sharded path", lambda: ck.save_sharded(path, _model(0)), loads_back(path), params=("path",))

        def loaded(extra):  # every save here saved _model(0): a load that succeeds gives its weights
            model = _model(1)
            assert isinstance(extra, dict) and ck.load_sharded(path, model) == extra
            assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), _model(0).state_dict().values()))

        outcome("load_sharded args", lambda: ck.load_sharded(path, _model(0)), loaded, params=("path",))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged") / "ck"
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    return ck.save_sharded(root, model, opt)


@FUZZ
@given(
    where=st.integers(0, 10**9),
    byte=st.integers(1, 255),
    file=st.sampled_from(["device-00000.safetensors", "index.json", "LATEST"]),
)
def test_a_damaged_checkpoint_is_refused_and_changes_nothing(saved, tmp_path_factory, where, byte, file):
    copy_root = tmp_path_factory.mktemp("copy") / "ck"
    shutil.copytree(saved.parent, copy_root)
    path = copy_root / file if file == "LATEST" else copy_root / saved.name / file
    raw = bytearray(path.read_bytes())
    raw[where % len(raw)] ^= byte
    path.write_bytes(bytes(raw))
    model = _model(1)
    opt = torch.optim.AdamW(model.parameters())
    before = copy.deepcopy(model.state_dict())
    reference = _model(2)
    ck.load_sharded(saved.parent, reference)  # the undamaged checkpoint's weights
    with time_bound(20):
        try:
            ck.load_sharded(copy_root, model, opt)
            # a flipped byte that changes no value (JSON whitespace): the weights as saved
            assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
            COUNTS["damaged checkpoint"]["correct"] += 1
        except CheckpointError as e:
            assert len(str(e)) > 15
            assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
            COUNTS["damaged checkpoint"]["typed error"] += 1
    COUNTS["damaged checkpoint"]["tried"] += 1


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from fsdp_xla.consolidate import build_parser as consolidate_parser
    from spmd.inspector.cli import build_parser as inspector_parser
    from spmd.plan.__main__ import parser as plan_parser

    return {
        "spmd.inspector": inspector_parser(),
        "fsdp_xla.consolidate": consolidate_parser(),
        "spmd.plan": plan_parser(),
    }


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help")


flag_value = st.one_of(
    st.sampled_from(["0", "-1", "-2", "nan", "inf", "1e309", "9" * 30, "", "/", "/dev/null", ".", "x" * 300]),
    st.integers(-5, 10**6).map(str),
    st.text(max_size=8),
)


@FUZZ
@given(cli=st.sampled_from(sorted(_parsers())), data=st.data())
def test_every_cli_flag(cli, data, tmp_path_factory):
    """Each flag with a bad or edge value: argparse's one-line usage error (exit 2) or a parse."""
    parser = _parsers()[cli]
    flag = data.draw(st.sampled_from(_flags(parser)))
    value = data.draw(flag_value)
    script = tmp_path_factory.mktemp("cli") / "script.py"
    script.write_text("")
    args = {
        "spmd.inspector": [flag, value, str(script)],
        "fsdp_xla.consolidate": [str(script.parent), flag, value],
        "spmd.plan": ["gpt2", "--topology", "v5e:2x2", flag, value],
    }[cli]
    COUNTS[f"{cli} flags"]["tried"] += 1
    with time_bound(10), contextlib.redirect_stderr(open("/dev/null", "w")):
        try:
            parsed = parser.parse_args(args)
            _check_parsed(next(a for a in parser._actions if flag in a.option_strings), value, parsed)
            COUNTS[f"{cli} flags"]["correct"] += 1
        except SystemExit as e:
            assert e.code == 2, (cli, flag, value)
            COUNTS[f"{cli} flags"]["typed error"] += 1


def _check_parsed(action: argparse.Action, value: str, parsed: argparse.Namespace) -> None:
    """A flag that parses holds what its text says: the number written (finite), one of its
    choices, a path; never a value argparse made up or a text it did not read."""
    got = getattr(parsed, action.dest)
    got = got[-1] if isinstance(action, argparse._AppendAction) else got
    kind = getattr(action.type, "__name__", None)
    if action.nargs == 0:
        assert got is True  # a switch; its "value" went to a positional
    elif action.choices is not None:
        assert got == value and value in action.choices
    elif kind == "parse":  # spmd.cli_args' bounded numbers
        assert type(got) in (int, float) and math.isfinite(got)
        assert got == (int(value) if type(got) is int else float(value))
    elif kind in ("output_file", "output_dir"):
        assert isinstance(got, Path) and got == Path(value)
    elif action.type is None:
        assert got == value
    else:
        assert got is not None and got != value  # its own parser (a mesh, a list): converted


def test_the_counts_are_written(tmp_path):
    """A record of the campaign for the note (run with -s to print it); each case counted once,
    with one outcome."""
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({k: dict(v) for k, v in COUNTS.items()}))
    for target, counts in json.loads(path.read_text()).items():
        assert counts["tried"] >= 1 and set(counts) <= {"tried", *OUTCOMES}, (target, counts)
        assert counts["tried"] == sum(counts.get(o, 0) for o in OUTCOMES), (target, counts)
