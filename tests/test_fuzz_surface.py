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
import shutil
import signal

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import Partial, Replicate, Shard

import fsdp_xla.checkpoint as ck
from fsdp_xla import CheckpointError, MixedPrecision, size_based_auto_wrap_policy, transformer_auto_wrap_policy
from mesh import Mesh
from spmd import P, ShardingSpec, placements_from_spec, spec_from_placements
from tests.test_fuzz_api import COUNTS, junk, outcome, report_counts  # noqa: F401 (the module fixture prints counts)

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


@FUZZ
@given(mesh=st.sampled_from(MESHES), placements=st.lists(placement, max_size=3), rank=st.integers(0, 3))
def test_spec_from_placements(mesh, placements, rank):
    with time_bound(10):
        outcome("spec_from_placements", lambda: spec_from_placements(placements, mesh, rank))


@FUZZ
@given(
    mesh=st.sampled_from(MESHES),
    entries=st.lists(st.one_of(st.none(), st.sampled_from(["data", "model"]), junk), max_size=4),
    rank=st.integers(-1, 4),
)
def test_placements_from_spec(mesh, entries, rank):
    with time_bound(10):
        outcome("placements_from_spec", lambda: placements_from_spec(P(*entries), mesh, rank))


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
    with time_bound(10):
        outcome("transformer policy", lambda: transformer_auto_wrap_policy(classes))


@FUZZ
@given(min_params=junk)
def test_size_wrap_policy(min_params):
    with time_bound(10):
        outcome("size policy", lambda: size_based_auto_wrap_policy(min_params))


@FUZZ
@given(
    mesh=st.one_of(st.sampled_from(MESHES), junk),
    entries=st.one_of(st.lists(st.one_of(st.none(), st.sampled_from(["data", "model", "x"]), junk), max_size=3), junk),
    minibatch=st.one_of(st.booleans(), junk),
)
def test_sharding_spec(mesh, entries, minibatch):
    with time_bound(10):
        outcome("ShardingSpec", lambda: ShardingSpec(mesh, entries, minibatch))


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))


@FUZZ
@given(path=junk, keep=junk, extra=st.one_of(junk, st.just({"step": torch.ones(1)})))
def test_save_sharded_arguments(tmp_path_factory, path, keep, extra):
    target = tmp_path_factory.mktemp("save")
    with time_bound(20), contextlib.chdir(target):  # a relative path lands in the temp dir
        outcome("save_sharded args", lambda: ck.save_sharded(target / "ck", _model(0), keep=keep, extra=extra))
        outcome("save_sharded path", lambda: ck.save_sharded(path, _model(0)))
        outcome("load_sharded args", lambda: ck.load_sharded(path, _model(0)))


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
    with time_bound(20):
        try:
            ck.load_sharded(copy_root, model, opt)
            COUNTS["damaged checkpoint"]["correct"] += 1  # a flipped byte that changes no value (JSON whitespace)
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
            parser.parse_args(args)
            COUNTS[f"{cli} flags"]["correct"] += 1
        except SystemExit as e:
            assert e.code == 2, (cli, flag, value)
            COUNTS[f"{cli} flags"]["typed error"] += 1


def test_the_counts_are_written(tmp_path):
    """A record of the campaign for the note (run with -s to print it)."""
    (tmp_path / "counts.json").write_text(json.dumps({k: dict(v) for k, v in COUNTS.items()}))
