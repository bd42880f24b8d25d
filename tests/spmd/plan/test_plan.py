"""The planner end to end on a small Llama on TPU v5e:2x2 (libtpu's compiler, no TPU), from the
compiles plan_worker.py runs in the background; and its errors, which need no compile."""

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from fsdp_xla.hf.config import read_fsdp_config
from mesh import Mesh
from spmd.plan import ModelSpecError, PlanError, PlanReport, TopologyError, advise, plan
from spmd.plan.__main__ import main as cli
from spmd.plan.api import DEFAULT_SEQ_LEN, check_even_splits, default_seq_len, param_spec_for, uneven_splits
from spmd.plan.compile.step import largest_buffers as _largest
from spmd.plan.compile.step import oom_counts_temporaries_only, vmem_refusal
from spmd.plan.compile.step import oom_used_bytes as _oom_used_bytes
from spmd.plan.report.plan_report import MemoryReport
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings
from tests.spmd.plan import plan_results

CHIPS = 4
BATCH, SEQ = 32, 128
BUDGET = 74 * 2**20  # between data parallel's state (72 MiB) and its total (77 MiB)


def tiny_llama_params() -> int:
    """Parameter count of plan_worker.TINY, by hand: embeddings, 2 layers, final norm, head."""
    h, i, v, layers = 512, 1024, 1024, 2
    layer = 4 * h * h + 3 * h * i + 2 * h
    return v * h + layers * layer + h + v * h


@pytest.fixture(scope="module")
def worker():
    return plan_results.results()


@pytest.fixture(scope="module")
def advice(worker):
    results, out = worker
    return json.loads((out / "advice.json").read_text())


def outcome(advice, strategy):
    (found,) = [o for o in advice["outcomes"] if o["strategy"] == strategy]
    return PlanReport.from_dict(found["report"])


def data_parallel(worker):
    """plan_worker's data-parallel plan of the advisor's step, compiled apart (the advisor rules it out unseen)."""
    return PlanReport.from_dict(worker[0]["dp"])


def test_argument_bytes_equal_the_sharding_math_exactly(advice, worker):
    fsdp = outcome(advice, "fsdp")
    # fp32 parameters, AdamW m and v, each 1/4 per chip (every dim divides), plus the int32 tokens.
    expected = 3 * 4 * tiny_llama_params() // CHIPS + 4 * BATCH * SEQ // CHIPS
    assert fsdp.memory.argument_bytes == expected
    assert fsdp.memory.predicted_argument_bytes == expected
    dp = data_parallel(worker)  # replicated: all of it on each chip
    assert dp.memory.argument_bytes == 3 * 4 * tiny_llama_params() + 4 * BATCH * SEQ // CHIPS


def test_doubling_the_fsdp_axis_halves_parameter_bytes(advice, worker):
    results, _ = worker
    four = outcome(advice, "fsdp")
    two = PlanReport.from_dict(results["two_slices"])
    assert (four.mesh, two.mesh) == ({"fsdp": 4}, {"data": 4, "fsdp": 2})
    # The batch splits 4 ways on one slice, 8 ways (data x fsdp) on two.
    assert two.memory.argument_bytes - 4 * BATCH * SEQ // 8 == 2 * (four.memory.argument_bytes - 4 * BATCH * SEQ // 4)


def test_advisor_picks_a_plan_that_fits_where_data_parallel_does_not(advice, worker):
    results, out = worker
    assert results["advise_exit"] == 0
    assert advice["hbm_bytes"] == BUDGET
    fsdp, dp = outcome(advice, "fsdp"), data_parallel(worker)
    assert not dp.fits and dp.memory.total_bytes > BUDGET
    assert fsdp.fits and fsdp.memory.total_bytes <= BUDGET
    # The advisor compiled no data-parallel plan: its state alone is 72 of the 74 MiB, and our math says why.
    (ruled_out,) = [o for o in advice["outcomes"] if o["strategy"] == "dp"]
    assert ruled_out["report"] is None
    assert ruled_out["skipped"].startswith("not compiled: our memory math gives"), ruled_out["skipped"]
    winner = [o for o in advice["outcomes"] if o["report"] and o["report"]["fits"]][0]
    assert winner["strategy"] in ("fsdp", "2d") and advice["winner"].startswith(winner["strategy"])
    assert f"winner: {winner['strategy']}" in results["advise_stdout"]
    # ranked by predicted MFU among the plans that fit, the roofline bound beside each
    fitting = [PlanReport.from_dict(o["report"]) for o in advice["outcomes"] if o["report"] and o["report"]["fits"]]
    mfus = [r.estimate.predicted_mfu for r in fitting]
    assert all(m > 0 for m in mfus) and mfus == sorted(mfus, reverse=True)
    assert "ranked by predicted MFU" in results["advise_stdout"] and "MFU bound" in results["advise_stdout"]
    assert "model = FSDP(" in advice["code"] and "LlamaDecoderLayer" in advice["code"]
    compile(advice["code"], "advice", "exec")
    assert "remat dots" in results["advise_stdout"] and "largest batch that fits" in results["advise_stdout"]
    config = read_fsdp_config(out / "fsdp_config.json", warn=False)
    assert config.layer_classes == ("LlamaDecoderLayer",) and not config.gradient_checkpointing
    assert (out / "advice.png").stat().st_size > 10_000


def test_two_d_plan_shards_heads_over_tensor(advice):
    two_d = outcome(advice, "2d")
    assert two_d.mesh == {"fsdp": 2, "tensor": 2} and two_d.fits
    assert two_d.param_specs["model.layers.0.self_attn.q_proj.weight"] == "P('tensor', 'fsdp')"
    for o in advice["outcomes"]:  # every compiled plan's arguments are the sharding math's
        if o["report"] is None:
            continue
        report = PlanReport.from_dict(o["report"])
        assert report.memory.argument_bytes == report.memory.predicted_argument_bytes


def test_the_first_advice_compiles_in_worker_processes_and_a_second_from_the_cache(advice, worker):
    # The first (--jobs 2) in spawned processes (a forked one aborts: libtpu is loaded here); the
    # second reads every compile from the cache in the main process and starts none.
    results, out = worker
    assert "advisor: compiling in 2 worker processes" in results["advise_stderr"]
    assert "[advisor: 1 plans done (0 cached)" in results["advise_stderr"]
    assert "worker processes" not in results["advise_again_stderr"]
    again = json.loads((out / "advice_again.json").read_text())
    assert results["advise_again_exit"] == 0
    compiled = [o for o in advice["outcomes"] if o["report"]]
    assert [o["cached"] for o in again["outcomes"] if o["report"]] == [True] * len(compiled)
    assert [o["report"]["memory"] for o in again["outcomes"] if o["report"]] == [
        o["report"]["memory"] for o in compiled
    ]


def test_two_slices_put_the_data_axis_over_dcn(worker):
    results, _ = worker
    two = PlanReport.from_dict(results["two_slices"])
    assert (two.chips, two.slices) == (8, 2)
    # Between the slices: the compiler first reduces the bf16 gradients within each slice (its 4
    # chips: data 2 x fsdp 2), then all-reduces each chip's quarter over the 2 slices (a 2-member
    # ring sends it once): hierarchical, as multi-slice training should be. bf16 or fp32 gradients
    # (torchax builds differ in where they promote), never more than a quarter of the model.
    dcn = sum(c.dcn_bytes_sent_per_chip for c in two.collectives)
    assert 0.99 * 2 * tiny_llama_params() / 4 <= dcn <= 1.01 * 4 * tiny_llama_params() / 4
    assert two.estimate.dcn_seconds > 0


def test_collectives_are_the_strategy_s(advice, worker):
    dp, fsdp = data_parallel(worker), outcome(advice, "fsdp")
    assert {c.kind for c in dp.collectives} == {"all-reduce"}
    # Data parallel all-reduces every bf16 gradient once: a ring sends 2 (n-1)/n of it per chip.
    grads = 2 * tiny_llama_params()
    (reduce,) = dp.collectives
    assert math.isclose(reduce.bytes_sent_per_chip, 2 * (CHIPS - 1) / CHIPS * grads, rel_tol=1e-3)
    assert {"all-gather", "reduce-scatter"} <= {c.kind for c in fsdp.collectives}


def test_collectives_in_loops_count_once_per_iteration(worker):
    results, _ = worker
    by_kind = {c["kind"]: c for c in results["loop_collectives"]}
    gather = by_kind["all-gather"]  # 5 loop iterations, each gathering 4 x [256, 512] f32
    assert (gather["count"], gather["result_bytes"], gather["group_size"]) == (5, 2 * 2**20, 4)
    assert gather["bytes_sent_per_device"] == 5 * 3 * 2**19
    psum = by_kind["all-reduce"]
    assert (psum["count"], psum["result_bytes"]) == (1, 2**19)
    assert psum["bytes_sent_per_device"] == 2 * 3 * 2**19 // 4


# libtpu's error when a program does not fit (Llama-2-7B, FSDP on v5e-256, no checkpointing).
OOM = """RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. \
Used 45.97G of 15.75G hbm. Exceeded hbm capacity by 30.22G.

Total hbm usage >= 46.22G:
    reserved        258.12M
    program          45.97G
    arguments            0B

  1. Size: 8.00G
     Operator: op_name="broadcast.141"
     Shape: bf16[32,1,32,2048,2048]{3,4,2,1,0:T(8,128)(2,1)}
     Unpadded size: 8.00G
"""


def test_the_compiler_s_oom_is_read_as_a_verdict():
    assert _oom_used_bytes(OOM) == int(45.97 * 2**30)
    assert _largest(OOM) == ("   8.00G  bf16[32,1,32,2048,2048]{3,4,2,1,0:T(8,128)(2,1)}  (broadcast.141)",)
    assert _oom_used_bytes("RESOURCE_EXHAUSTED: something else") is None
    # libtpu 0.0.52's form names the temporaries only (the planner adds the arguments).
    new = (
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (111.13G) exceeds available HBM (94.74G). HLO module: jit_step."
    )
    assert _oom_used_bytes(new) == int(111.13 * 2**30) and oom_counts_temporaries_only(new)
    assert not oom_counts_temporaries_only(OOM)


# libtpu 0.0.52's refusal of splash blocks of 8,192 at 8,192 tokens on v5e:2x2 (a 2-layer Llama,
# `--splash-blocks 8192`, compiled here in 5 min 48 s), cut to its lines that name the kernel
VMEM = """INTERNAL: Mosaic failed to compile TPU kernel: RESOURCE_EXHAUSTED
     XLA label: splash_mha_fwd_residuals.3 = custom-call(get-tuple-element.1622.data_next_ref, ...(+2)), custom_call_target="tpu_custom_call"
     Allocation type: scoped
 [type.googleapis.com/tensorflow.tpu.CompilationResultProto='\x08\x08\x12\xba\'Ran out of memory in memory space vmem. Used 287.21M of 128.00M vmem. Exceeded vmem capacity by 159.21M.\n\nProgram vmem requ...[truncated]']"""


def test_a_kernel_the_core_s_vector_memory_cannot_hold_is_refused_naming_the_blocks():
    refusal = vmem_refusal(VMEM)
    assert isinstance(refusal, PlanError)
    assert str(refusal).startswith("libtpu cannot fit splash_mha_fwd_residuals.3 in the core's vector memory (VMEM)")
    assert "need 287.21MB of 128.00MB" in str(refusal) and "give smaller --splash-blocks" in str(refusal)
    assert _oom_used_bytes(VMEM) is None  # not the plan's HBM: no verdict
    assert vmem_refusal(OOM) is None and vmem_refusal("RESOURCE_EXHAUSTED: something else") is None


# libtpu 0.0.52's refusal of tpu-recipes' Mistral-7B on v6e-8 (splash blocks of 2,048 with the fused
# backward, 6 x 8192 tokens a chip) at libtpu's default scoped VMEM, cut to its first and last lines
SCOPED_VMEM = """jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:
Ran out of memory in memory space vmem while allocating on stack for %splash_mha_dkv_no_residuals.2 = (bf16[6,4,32,8192,128]{4,3,2,1,0:T(8,128)(2,1)}) custom-call(%copy-done.155), custom_call_target="tpu_custom_call"
}}, metadata={op_name="jit(step)/transpose(jvp())/while/body/splash_fused_bwd/shard_map/pallas_call"}. Scoped allocation with size 33.74M and limit 32.00M exceeded scoped vmem limit by 1.74M. It should not be possible to run out of scoped vmem -
See https://openxla.org/xla/errors/error_1001 for more details."""


def test_a_kernel_over_the_scoped_vector_memory_is_refused_naming_the_limit():
    refusal = vmem_refusal(SCOPED_VMEM)
    assert isinstance(refusal, PlanError)
    assert str(refusal).startswith(
        "libtpu cannot fit splash_mha_dkv_no_residuals.2 in the scoped vector memory (VMEM) a kernel may take: "
        "it needs 33.74MB of 32.00MB. Raise the limit with --scoped-vmem-kib"
    )
    assert _oom_used_bytes(SCOPED_VMEM) is None


def test_a_compile_passes_libtpu_its_options_and_names_a_scoped_refusal(monkeypatch):
    import spmd.plan.compile.step as step

    given = {}

    def refuse(lowered, options):
        given.update(options)
        raise RuntimeError(SCOPED_VMEM)

    monkeypatch.setattr(step, "compile_with_hlo", refuse)
    options = PlanSettings("v6e-8", scoped_vmem_kib=98304).compiler_options
    with pytest.raises(PlanError, match="Raise the limit with --scoped-vmem-kib"):
        step.compile_step(object(), options)
    assert given == {"xla_tpu_scoped_vmem_limit_kib": 98304}


@pytest.mark.parametrize("bad", [0, 128 * 1024 + 1, True, 1.5, "98304"])
def test_the_scoped_vmem_limit_is_a_whole_number_of_kib_a_core_can_hold(bad):
    with pytest.raises(PlanError, match="scoped_vmem_kib must be a whole number of KiB from 1 to 131072"):
        PlanSettings("v6e-8", scoped_vmem_kib=bad)


def test_the_scoped_vmem_limit_reaches_libtpu_and_keys_the_cache():
    given = PlanSettings("v6e-8", scoped_vmem_kib=98304)
    assert given.compiler_options == {"xla_tpu_scoped_vmem_limit_kib": 98304}
    assert given.cache_key()["xla_tpu_scoped_vmem_limit_kib"] == 98304
    default = PlanSettings("v6e-8")
    assert default.compiler_options == {} and "xla_tpu_scoped_vmem_limit_kib" not in default.cache_key()


def test_bf16_weights_halve_the_parameters_and_second_moment_and_key_the_cache():
    # MaxText's weight_dtype: the parameters and optax's second moment in it; mu_dtype its own
    assert [(s.weight_bytes, s.moment_bytes) for s in (
        PlanSettings("v6e-32"), PlanSettings("v6e-32", weight_dtype="bfloat16"),
        PlanSettings("v6e-32", weight_dtype="bfloat16", moment_dtype="bfloat16"),
    )] == [(4, 8), (2, 6), (2, 4)]  # fmt: skip
    assert PlanSettings("v6e-32", weight_dtype="bfloat16").cache_key()["weight_dtype"] == "bfloat16"
    assert "weight_dtype" not in PlanSettings("v6e-32").cache_key()  # fp32 plans keep their cache entries


def test_an_oom_report_says_so_with_the_compiler_s_buffers(advice):
    fits = outcome(advice, "fsdp")
    used = _oom_used_bytes(OOM)
    memory = MemoryReport(
        used, compiler_oom_bytes=used, hbm_bytes=16 * 2**30, predicted_argument_bytes=1000,
        largest_allocations=_largest(OOM),
    )  # fmt: skip
    report = dataclasses.replace(fits, memory=memory)
    assert not report.fits and report.memory.margin_bytes == 16 * 2**30 - used
    assert report.memory.short_verdict() == "OOM (-29.97 GiB)"
    table = report.table()
    assert "ran out of HBM: 45.97 GiB" in table and "bf16[32,1,32,2048,2048]" in table
    assert "no collectives or step estimate" in table and "roofline" not in table
    assert table.endswith("OOM: 45.97 GiB needed, 16.00 GiB HBM per device (29.97 GiB short)")
    assert PlanReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_the_compiler_s_acceptance_is_the_verdict_for_the_chip_s_own_hbm(advice):
    fsdp = outcome(advice, "fsdp")
    assert not fsdp.memory.compiler_accepted  # judged against the 74 MiB budget, by the analysis
    over = dataclasses.replace(fsdp.memory, hbm_bytes=fsdp.memory.total_bytes - 1, compiler_accepted=True)
    report = dataclasses.replace(fsdp, memory=over)
    assert report.fits and "no margin left" in report.verdict()
    assert over.fits_with_no_margin and over.short_verdict() == "fits (compiler; no margin)"
    assert not fsdp.memory.fits_with_no_margin and fsdp.memory.short_verdict() == "fits"
    assert not report.with_hbm(over.hbm_bytes - 1).fits  # a budget below the chip: the analysis decides


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        (dict(strategy="zero3"), PlanError, "Unknown strategy"),
        (dict(compute_dtype="float16"), PlanError, "compute_dtype"),
        (dict(mesh={"fsdp": 2, "model": 2}), PlanError, "Rename the axes"),
        (dict(mesh={"fsdp": 8}), PlanError, "multiply to 4"),
        (dict(strategy="2d", mesh={"fsdp": 4}), PlanError, "needs mesh axes"),
        (dict(global_batch=6), PlanError, "multiple of 4"),
        (dict(seq_len=1), PlanError, "seq_len"),
        (dict(seq_len=10**12), PlanError, "seq_len must be an int from 2 to 16777216"),
        (
            dict(remat="some"),
            PlanError,
            r"remat must be one of \['none', 'dots', 'save_qkv_context', 'save_dot_except_mlp', 'save_qkv_proj', 'full', "
            r"'offload'\] "
            r"\(or 'minimal', MaxText's name for 'dots'\)",
        ),
        (dict(moment_dtype="float16"), PlanError, r"moment_dtype must be one of \('float32', 'bfloat16'\)"),
        (dict(weight_dtype="float16"), PlanError, r"weight_dtype must be one of \('float32', 'bfloat16'\)"),
        (dict(attention="ring"), PlanError, r"attention must be one of \['dot', 'flash'\]"),
        (dict(attention="flash", seq_len=1000), PlanError, "divisible by 128"),
        (dict(seq_len=2048), PlanError, r"longer than the model's learned position table \(n_positions=1024\)"),
        (dict(hbm_bytes=-1), PlanError, "hbm_bytes must be a positive int"),
        (dict(strategy="2d", tensor=0), PlanError, "tensor must be a whole number from 1 to 4096"),  # ZeroDivisionError
        (
            dict(strategy="2d", tensor="a"),
            PlanError,
            r"tensor must be a whole number from 1 to 4096 \(the tensor axis size\), got 'a'",
        ),
        (dict(mesh=[4]), PlanError, r"mesh must map axis names to sizes, e.g. \{'fsdp': 32, 'tensor': 4\}, got \[4\]"),
        (dict(hbm_bytes=float("nan")), PlanError, "hbm_bytes must be a positive int .*got nan"),
        (dict(global_batch=4 * 10**30), PlanError, "global_batch must be a whole number of sequences from 1 to 2"),
    ],
)
def test_bad_requests_say_what_to_change(kwargs, error, says):
    with pytest.raises(error, match=says):
        plan("gpt2", "v5e:2x2", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (dict(jobs=0), "jobs must be a whole number from 1 to 64"),  # ran as 1, silently
        (dict(jobs=-5), "jobs must be a whole number from 1 to 64"),
        (dict(hbm_bytes=0), "hbm_bytes must be a positive int"),
        (dict(compute_dtype="float16"), r"compute_dtype must be one of \('bfloat16', 'float32'\)"),
        (dict(hbm_bytes=2.5), r"hbm_bytes must be a positive int \(bytes per device\) or None, got 2.5"),
        (dict(moment_dtype="int8"), "moment_dtype must be one of"),
        (dict(weight_dtype="bf16"), "weight_dtype must be one of"),
        (dict(per_device_batches=["1", 2]), r"per_device_batches must be positive integers, got \['1', 2\]"),
        (dict(strategies="fsdp,foo"), "Unknown strategy 'foo'"),  # a string was split into letters: 'f'
        (dict(strategies=["2d"], tensors=["a"]), r"tensors must be positive integers, got \['a'\]"),
        (dict(datas=[-1]), r"datas must be positive integers, got \[-1\]"),
        (dict(remats="fully"), "remat must be one of"),
    ],
)
def test_bad_advice_requests_are_refused_before_compiling(kwargs, says):
    with pytest.raises(PlanError, match=says):
        advise("gpt2", "v5e:2x2", **kwargs)


def test_a_dict_that_is_not_a_report_is_a_plan_error():
    with pytest.raises(PlanError, match="Not a plan report: KeyError 'memory'"):
        PlanReport.from_dict({})


def test_unknown_models_and_slices_are_named(tmp_path):
    with pytest.raises(ModelSpecError, match="Unknown model 'llama9'"):
        plan("llama9", "v5e:2x2")
    with pytest.raises(TopologyError, match="Unknown TPU slice"):
        plan("gpt2", "v9-8")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt9", "n_layer": 1}))
    with pytest.raises(ModelSpecError, match="cannot build a config of model_type 'gpt9': Unrecognized model"):
        plan(str(config), "v5e:2x2")
    with pytest.raises(TopologyError, match=r"'v5e-3': 3 chips is not a power of two.*'v5e:4x6'"):
        plan("gpt2", "v5e-3")
    with pytest.raises(TopologyError, match=r"'v5p-6' \(the name counts cores: 6 cores are 3 chips\)"):
        plan("gpt2", "v5p-6")


def test_the_sequence_defaults_to_what_the_model_can_run():
    assert default_seq_len(build_meta_model("gpt2")[1]) == 1024  # its learned position table
    assert default_seq_len(build_meta_model("llama2-7b")[1]) == DEFAULT_SEQ_LEN == 2048  # rotary


def test_a_plan_that_splits_a_dim_unevenly_names_it_before_compiling():
    module, config = build_meta_model("gpt2")
    mesh = Mesh(np.arange(4), (2, 2), ("fsdp", "tensor"))
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}
    with pytest.raises(
        PlanError,
        match=r"splits 1 parameter\(s\).*transformer.wte.weight \(50257, 768\): dim 0 \(50257\) over tensor=2",
    ):
        check_even_splits("2d", shapes, param_spec_for("2d", mesh, config), mesh)
    fsdp = Mesh(np.arange(4), (4,), ("fsdp",))
    assert uneven_splits(shapes, param_spec_for("fsdp", fsdp, config), fsdp) == []


def test_the_advisor_says_when_there_is_nothing_to_try():
    with pytest.raises(PlanError, match=r"No candidate to compile: .*tensor sizes \[3\].*divide the 4 devices"):
        advise("gpt2", "v5e:2x2", strategies=["2d"], tensors=[3])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--advise", "--strategy", "2d"], "--strategy choose one plan, and --advise tries many"),
        (["--advise", "--remat", "full", "--batch", "8"], "--batch, --remat choose one plan"),
        (["--mesh", "fsdp=4,fsdp=1"], "--mesh names axis 'fsdp' twice"),
        (
            ["--jobs", "2"],
            "--jobs only steers the advisor's search, which runs with --advise: add --advise, or leave it",
        ),
        (["--remats", "full", "--no-cache"], "--remats, --no-cache only steer the advisor's search"),
        (["--strategies", "fsdp", "--fsdp-config", "/tmp/x.json"], "--strategies, --fsdp-config only steer"),
        (["--per-device-batches", "1", "--tensors", "2", "--datas", "1"], "--per-device-batches, --tensors, --datas"),
        (["--cache", "/tmp"], "--cache only steers the advisor's search"),
        (
            ["--remat", "most"],
            "--remat: unknown remat policy 'most'; choose from none,dots,save_qkv_context,save_dot_except_mlp",
        ),
    ],
)
def test_the_cli_refuses_flags_that_contradict(argv, says, capsys):
    with pytest.raises(SystemExit) as exit:
        cli(["gpt2", "--topology", "v5e:2x2", *argv])
    assert exit.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--hbm-gib", "-1"], "--hbm-gib: -1.0 is out of range"),
        (["--hbm-gib", "nan"], "--hbm-gib: 'nan' is not a finite number"),
        (["--tensor", "0"], "--tensor: 0 is out of range"),
        (["--batch", "1" * 30], "is too large: give a whole number from 1 to 2147483648"),
        (["--slices", "0"], "--slices: 0 is out of range"),
        (["--slices", "512"], "--slices: 512 is out of range: give a whole number from 1 to 511"),  # libtpu aborted
        (["--seq", "-5"], "--seq: -5 is out of range"),
        (["--seq", "1"], "--seq: 1 is out of range: give a whole number from 2 to"),
        (["--mesh", "fsdp=0"], "sizes 1 or more"),
        (["--json", "/nonexistent-dir/x.json"], "--json: the directory /nonexistent-dir does not exist"),
        (["--json", "/proc/x.json"], "--json: cannot create files in the directory /proc"),
        (["--plot", "/proc/x.png"], "--plot: cannot create files in the directory /proc"),
        (["--advise", "--per-device-batches", "0,1"], "--per-device-batches: expected comma-separated whole numbers"),
        (["--advise", "--jobs", "0"], "--jobs: 0 is out of range"),
    ],
)
def test_the_cli_checks_every_number_and_path_when_parsing(argv, says, capsys):
    with pytest.raises(SystemExit) as exit:
        cli(["gpt2", "--topology", "v5e:2x2", *argv])
    assert exit.value.code == 2 and says in capsys.readouterr().err


def test_a_config_that_is_not_a_regular_file_is_refused_unread(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(ModelSpecError, match="is a FIFO; it must be a regular file"):
        build_meta_model(str(fifo))
    with pytest.raises(TopologyError, match="'v5e-0': v5e slice names count chips"):
        plan("gpt2", "v5e-0")


def test_ctrl_c_leaves_a_partial_table(worker):
    # plan_worker stops the advisor's CLI with KeyboardInterrupt at its second compile.
    results, _ = worker
    found = results["interrupted"]
    assert found["exit"] == 130
    assert "interrupted (Ctrl-C) after 1 plans: a partial ranking" in found["stdout"]
    assert "fsdp fsdp=4 · batch 8 · remat dots" in found["stdout"]
    assert "[advisor: 1 plans done (0 cached), about 1 left (at most 1), about" in found["stderr"]
    assert "advisor: interrupted after 1 plans; the table is partial" in found["stderr"]
