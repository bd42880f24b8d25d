"""``--splash-blocks``: MaxText's eight splash block sizes, read, checked and carried to the kernel
(the compiled kernel's own grid is checked in test_layer_period.py)."""

import dataclasses
import importlib.util

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spmd.plan.__main__ import main as cli
from spmd.plan.errors import PlanError
from spmd.plan.request.settings import PlanSettings
from spmd.plan.request.splash_blocks import SplashBlocks, parse_splash_blocks

NAMES = tuple(f.name for f in dataclasses.fields(SplashBlocks) if f.name != "use_fused_bwd_kernel")


@given(st.dictionaries(st.sampled_from(NAMES), st.integers(1, 10**6).map(lambda n: 128 * n), min_size=1))
def test_named_sizes_read_back_as_given(sizes):
    for prefix in ("", "sa_block_"):
        text = ",".join(f"{prefix}{name}={size}" for name, size in sizes.items())
        assert parse_splash_blocks(text).given == sizes


@given(st.integers(1, 64).map(lambda n: 128 * n), st.integers(1, 64))
def test_unnamed_blocks_are_the_planner_s_and_each_compute_size_its_block_s(kv, blocks):
    seq = kv * blocks
    sizes = parse_splash_blocks(f"kv={kv}").resolved(seq)
    own = 512 if seq % 512 == 0 else 256 if seq % 256 == 0 else 128
    assert sizes["kv"] == sizes["kv_compute"] == kv
    assert sizes["q"] == sizes["q_dkv"] == sizes["kv_dkv"] == sizes["kv_dkv_compute"] == sizes["q_dq"] == own
    assert all(seq % size == 0 for size in sizes.values())


def test_one_size_sets_all_eight():
    assert parse_splash_blocks("1024").given == dict.fromkeys(NAMES, 1024)


def test_the_fused_backward_is_read_by_maxtexts_name_beside_the_sizes():
    blocks = parse_splash_blocks("2048,q_dkv=1024,sa_use_fused_bwd_kernel=True")
    # the query gradient runs in the key gradient's kernel, on its blocks: its own sizes are unused
    fused = {name: 2048 for name in NAMES if name not in ("q_dq", "kv_dq")}
    assert blocks.given == {**fused, "q_dkv": 1024, "use_fused_bwd_kernel": True}
    sizes = blocks.resolved(8192)
    assert (sizes["q_dq"], sizes["kv_dq"]) == (sizes["q_dkv"], sizes["kv_dkv"]) == (1024, 2048)
    assert parse_splash_blocks("use_fused_bwd_kernel=false") == SplashBlocks()
    assert not parse_splash_blocks("use_fused_bwd_kernel=false").given
    with pytest.raises(PlanError, match="use_fused_bwd_kernel must be a bool, got int 1"):
        SplashBlocks(use_fused_bwd_kernel=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("q=100", "splash block q=100 is not a positive multiple of 128"),
        ("block_q=512", "cannot read splash block 'block_q=512'"),
        ("q=512,q=1024", "each once"),
        ("q=abc", "cannot read splash block 'q=abc'"),
        ("q=1" + "0" * 12, "cannot read"),
        ("q", "cannot read splash block 'q'"),
        (" , ", "the splash blocks are empty"),
        ("use_fused_bwd_kernel=yes", "cannot read splash block 'use_fused_bwd_kernel=yes'"),
        ("q=512,1024", "cannot read splash block '1024'. Give one size for all first"),
        ("use_fused_bwd_kernel=true,use_fused_bwd_kernel=true", "each once"),
    ],
)
def test_unreadable_sizes_are_refused_naming_the_fix(text, says):
    with pytest.raises(PlanError, match=says):
        parse_splash_blocks(text)


@pytest.mark.parametrize(
    ("text", "seq", "says"),
    [
        ("q=768", 1024, "splash block q=768 does not divide the 1024-token sequence"),
        ("kv=1024,kv_compute=768", 4096, "kv_compute=768 does not divide its block kv=1024"),
        ("kv_dkv=512,kv_dkv_compute=1024", 4096, "kv_dkv_compute=1024 does not divide its block kv_dkv=512"),
    ],
)
def test_sizes_that_do_not_tile_the_sequence_are_refused(text, seq, says):
    with pytest.raises(PlanError, match=says):
        parse_splash_blocks(text).resolved(seq)


def test_the_settings_check_blocks_once_the_sequence_is_known_and_only_under_flash():
    with pytest.raises(PlanError, match="only --attention flash runs"):
        PlanSettings("v5e:2x2", attention="dot", splash_blocks="q=1024")
    with pytest.raises(PlanError, match="does not divide the 1536-token sequence"):
        PlanSettings("v5e:2x2", seq_len=1536, attention="flash", splash_blocks="q=1024")
    with pytest.raises(PlanError, match="splash block q must be an int"):
        SplashBlocks(q=1024.0)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="splash_blocks must be SplashBlocks"):
        PlanSettings("v5e:2x2", attention="flash", splash_blocks={"q": 1024})  # type: ignore[arg-type]
    given = PlanSettings("v5e:2x2", seq_len=2048, attention="flash", splash_blocks="q=1024")
    assert given.splash_blocks == SplashBlocks(q=1024)
    assert given.cache_key()["splash_blocks"] == {"q": 1024}
    assert "splash_blocks" not in PlanSettings("v5e:2x2", attention="flash").cache_key()  # old entries still hit


def test_the_models_default_sequence_is_checked_once_it_is_known_and_a_given_one_on_construction():
    unknown = PlanSettings("v5e:2x2", attention="flash", splash_blocks="q=1024", vocab_tiles=4)
    unknown.check_model_sequence(2048)  # 1024-token blocks and 4 tiles divide the model's 2,048
    with pytest.raises(PlanError, match="does not divide the 1536-token sequence"):
        unknown.check_model_sequence(1536)
    with pytest.raises(PlanError, match="vocab_tiles=3 does not divide the sequence"):
        PlanSettings("v5e:2x2", vocab_tiles=3).check_model_sequence(1024)
    with pytest.raises(PlanError, match="divisible by 128"):  # the planner's own blocks need 128 | seq
        PlanSettings("v5e:2x2", attention="flash").check_model_sequence(1000)
    PlanSettings("v5e:2x2", attention="dot").check_model_sequence(1000)  # no kernel, no blocks
    given = PlanSettings("v5e:2x2", seq_len=2048, attention="flash", splash_blocks="q=1024")
    given.check_model_sequence(2048)  # the given blocks were checked on construction
    own = PlanSettings("v5e:2x2", seq_len=1000, attention="flash")  # a plan's context checks come first
    with pytest.raises(PlanError, match="divisible by 128"):
        own.check_model_sequence(1000)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--splash-blocks", "q=100"], "--splash-blocks: splash block q=100 is not a positive multiple of 128"),
        (["--splash-blocks", "x=512"], "--splash-blocks: cannot read splash block 'x=512'"),
        (["--splash-blocks", "use_fused_bwd_kernel=1"], "cannot read splash block 'use_fused_bwd_kernel=1'"),
        (["--scoped-vmem-kib", "0"], "--scoped-vmem-kib"),
        (["--scoped-vmem-kib", "131073"], "--scoped-vmem-kib"),
    ],
)
def test_the_cli_reads_the_flag_when_parsing(argv, says, capsys):
    with pytest.raises(SystemExit) as exit:
        cli(["gpt2", "--topology", "v5e:2x2", "--attention", "flash", *argv])
    assert exit.value.code == 2 and says in capsys.readouterr().err


def test_a_context_axis_keeps_its_own_kernel_and_says_so():
    from spmd.plan.advisor.advisor import advise
    from spmd.plan.api import plan

    with pytest.raises(PlanError, match="context parallelism runs its own kernel"):
        plan(
            "llama3.1-8b", "v5e:2x2", strategy="cp", mesh={"fsdp": 2, "context": 2}, seq_len=8192,
            attention="flash", splash_blocks="q=1024",
        )  # fmt: skip
    with pytest.raises(PlanError, match="context parallelism runs its own kernel"):  # before any compile
        advise(
            "llama3.1-8b", "v5e:2x2", strategies=["fsdp", "cp"], seq_len=8192, attention="flash",
            splash_blocks="q=1024", cache_dir=None,
        )  # fmt: skip


def test_published_runs_carry_their_maxtext_configs_blocks_to_the_plan():
    from spmd.plan.predict.published import published_run
    from tests.torchrun import ROOT

    spec = importlib.util.spec_from_file_location("plan_prediction", ROOT / "benchmarks" / "plan_prediction.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for run in ("gemma3-12b@v6e-256", "gemma3-12b@2xv6e-256", "gemma3-12b@4xv6e-256"):
        settings = bench._candidate(published_run(run))[1].plan
        assert settings.splash_blocks.given == {
            "q": 1024, "kv": 1024, "kv_compute": 1024, "q_dkv": 512, "kv_dkv": 2048, "kv_dkv_compute": 512,
            "q_dq": 1024, "kv_dq": 1024,
        }  # fmt: skip
    assert not bench._candidate(published_run("llama3.1-70b@tpu7x-128"))[1].plan.splash_blocks.given
    # tpu-recipes' Llama 3.1-8B configs (MaxText 9f1820b): all eight 2048, the fused backward, 96 MiB of VMEM
    for chips in (16, 32, 64, 128, 256):
        settings = bench._candidate(published_run(f"llama3.1-8b@v6e-{chips}"))[1].plan
        assert settings.splash_blocks.given == {
            **dict.fromkeys(("q", "kv", "kv_compute", "q_dkv", "kv_dkv", "kv_dkv_compute"), 2048),
            "use_fused_bwd_kernel": True,
        }
        assert settings.compiler_options == {"xla_tpu_scoped_vmem_limit_kib": 98304}
    settings = bench._candidate(published_run("llama3.1-405b@2xv6e-256"))[1].plan
    assert settings.splash_blocks.given == {"q": 1024, "q_dkv": 2048, "q_dq": 2048}
    assert settings.compiler_options == {"xla_tpu_scoped_vmem_limit_kib": 98304}
