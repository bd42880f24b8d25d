"""Run by the planner tests in their own process: every TPU compile they need, once.

    python tests/workers/plan_worker.py OUT_DIR [SECTION ...]

A subprocess because the test session's XLA_FLAGS (8 virtual CPU devices, the inspector's HLO
dumps) would apply to the TPU compiles too, and because libtpu and torchax stay out of the test
session. Writes OUT_DIR/results.json, or results-SECTION.json (SECTION the first named) when
sections are named: tests/spmd/plan/plan_results.py runs them in three processes. Runs on both
lanes; what a lane cannot compile (tpu7x on libtpu 0.0.20) is recorded as the error the planner
gives.
"""

import contextlib
import io
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

from spmd.plan import plan
from spmd.plan.__main__ import main as cli
from spmd.plan.errors import ShardingError

TINY = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
# The fidelity checks' Llama: no dim equals the sequence (384), so a buffer with two dims of 384
# is a seq x seq one; 3 layers, a number no other dim is either.
FIDELITY = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 640,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
FIDELITY_SEQ = 384
POLICY_BATCH = 32  # the policies' step: 8 sequences a chip on v5e:2x2 (test_step_options.PER_CHIP)
REMATS = ("none", "dots", "offload")  # `full` is offload's program without the transfers: the slow tests plan it
# The advisor beside every plan it could try (`every_plan`): FSDP, 2 policies x 2 batches, at the
# sequence `advisor` and `refined_advice` plan, whose compile cache it shares (`ADVICE_CACHE`).
EVERY_BATCHES, EVERY_SEQ, EVERY_REMATS = (4, 8), 128, ("dots", "full")
ADVICE_CACHE = "cache"


def run_cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli(args)
    return code, out.getvalue(), err.getvalue()


def advisor(config: Path, out: Path, results: dict) -> None:
    """Data parallel, FSDP and 2-D on 4 chips under a 74 MiB budget, through the CLI, compiling in 2
    worker processes; then again, every compile from the cache."""
    args = lambda name: [  # noqa: E731
        str(config), "--topology", "v5e:2x2", "--advise", "--strategies", "dp,fsdp,2d", "--tensors", "2",
        "--per-device-batches", "8", "--remats", "dots", "--seq", "128", "--hbm-gib", str(74 / 1024),
        "--cache", str(out / ADVICE_CACHE), "--json", str(out / name), "--fsdp-config", str(out / "fsdp_config.json"),
        "--plot", str(out / "advice.png"), "--refine", "0",  # presets only: refined_advice tries the rest
    ]  # fmt: skip
    results["advise_exit"], results["advise_stdout"], results["advise_stderr"] = run_cli(args("advice.json"))
    results["advise_again_exit"], _, results["advise_again_stderr"] = run_cli(
        [*args("advice_again.json"), "--jobs", "2"]
    )
    # The advisor rules data parallel out by our math: compile it apart for the tests that read it.
    results["dp"] = plan(
        str(config), "v5e:2x2", strategy="dp", global_batch=32, seq_len=128, remat="dots", hbm_bytes=74 * 2**20
    ).to_dict()


def policies_and_kernels(config: Path, results: dict) -> None:
    """Each remat policy, and flash attention, on one FSDP step at seq 512 (where the scores matter),
    8 sequences per chip: enough that what a policy keeps spills out of on-chip memory into HBM (a
    layer's scores are 16 MiB a chip), and unlike the 4 heads, so a scores shape names its batch.
    16 a chip (before) gave the same orderings in 201 s of compile CPU; 8 take 143 s."""
    for remat in REMATS:
        report = plan(str(config), "v5e:2x2", global_batch=POLICY_BATCH, seq_len=512, remat=remat)
        results[f"remat_{remat}"] = report.to_dict()
    flash = plan(str(config), "v5e:2x2", global_batch=POLICY_BATCH, seq_len=512, attention="flash")
    results["flash"] = flash.to_dict()


def _compiled(
    config: Path, remat: str, attention: str, moment_dtype: str = "float32", weight_dtype: str = "float32"
) -> dict:
    """One step of FIDELITY on tpu7x:2x2x1 (16 sequences of 384): every shape in its optimized
    HLO with two dims of the sequence's length, its memory, and what the block scan saves."""
    import re

    from spmd.plan.api import _lower, _request
    from spmd.plan.compile.step import compile_step
    from spmd.plan.request.models import build_meta_model
    from spmd.plan.request.settings import PlanSettings

    settings = PlanSettings(
        "tpu7x:2x2x1", 1, FIDELITY_SEQ, "bfloat16", attention, None, moment_dtype, weight_dtype=weight_dtype
    )
    req = _request(settings, "fsdp", None, 16, remat, 4)
    module, hf_config = build_meta_model(str(config))
    lowered, _, _ = _lower(req, module, hf_config, FIDELITY_SEQ, None)
    compiled = compile_step(lowered.lowered)
    square = sorted({s for s in re.findall(r"\w+\[[\d,]+\]", compiled.hlo_text) if s.count(str(FIDELITY_SEQ)) >= 2})
    saved = [[list(a.shape), a.dtype, a.on_host] for a in lowered.saved_per_layer]
    return {"square": square, "memory": compiled.memory, "saved": saved}


def fidelity(out: Path, results: dict) -> None:
    """Flash attention holds no seq x seq buffer where dot attention does; what each remat policy
    saves (lowered only), beside our math's count of it; the arguments with a bf16 first moment
    (flash), and with bf16 weights and second moment beside an fp32 first moment (dot)."""
    from spmd.plan.api import _lower, _request
    from spmd.plan.predict.memory import model_shape, saved_per_token
    from spmd.plan.request.models import build_meta_model
    from spmd.plan.request.remat import Remat
    from spmd.plan.request.settings import PlanSettings

    config = out / "fidelity_llama.json"
    config.write_text(json.dumps(FIDELITY))
    try:
        flash_full = _compiled(config, "full", "flash", "bfloat16")
    except ShardingError as e:  # libtpu 0.0.20 (the torch_xla lane) knows no tpu7x
        results["fidelity"] = {"error": [type(e).__name__, str(e)]}
        return
    found = {"flash_full": flash_full, "dot_dots": _compiled(config, "dots", "dot", weight_dtype="bfloat16")}
    module, hf_config = build_meta_model(str(config))
    shape = model_shape(hf_config, sum(p.numel() for p in module.parameters()))
    saved, math = {}, {}
    for remat in Remat:
        settings = PlanSettings("tpu7x:2x2x1", 1, FIDELITY_SEQ, "bfloat16", "flash")
        lowered, _, _ = _lower(_request(settings, "fsdp", None, 16, remat, 4), module, hf_config, FIDELITY_SEQ, None)
        saved[remat.value] = [[list(a.shape), a.dtype, a.on_host] for a in lowered.saved_per_layer]
        math[remat.value] = list(saved_per_token(shape, remat, settings.attention, FIDELITY_SEQ))
    found.update(saved=saved, math=math, n_params=shape.n_params)
    results["fidelity"] = found


CONTEXT_SEQ, CONTEXT_MESH = 512, {"fsdp": 2, "context": 4}  # no dim of FIDELITY is 512


def context_parallel(out: Path, results: dict) -> None:
    """FIDELITY with its sequence over a context axis on tpu7x:2x2x1 (fsdp=2 x context=4, 4
    sequences of 512, the Ironwood recipes' remat): the report, every collective with its group,
    the shapes with two dims of the sequence's length; then the advisor's cp search of the same
    plan, read from the cache the plan was written to (no second compile)."""
    import re

    from spmd.plan.advisor.advice import Candidate
    from spmd.plan.advisor.advisor import advise
    from spmd.plan.advisor.plan_cache import Settings, entry_path, model_key, write_entry
    from spmd.plan.api import plan_program
    from spmd.plan.compile.program import step_collectives
    from spmd.plan.request.settings import PlanSettings

    config = out / "fidelity_llama.json"
    settings = PlanSettings("tpu7x:2x2x1", 1, CONTEXT_SEQ, "bfloat16", "flash")
    try:
        report, hlo = plan_program(str(config), settings, mesh=CONTEXT_MESH, global_batch=4, remat="save_qkv_context")
    except ShardingError as e:  # libtpu 0.0.20 (the torch_xla lane) knows no tpu7x
        results["context"] = {"error": [type(e).__name__, str(e)]}
        return
    cache = out / "context_cache"
    candidate = Candidate("cp", tuple(CONTEXT_MESH.items()), 2, "save_qkv_context")
    write_entry(entry_path(candidate, Settings(settings, cache, model_key(str(config)))), report, print)
    advice = advise(
        str(config), "tpu7x:2x2x1", strategies=["cp"], contexts=[4], per_device_batches=[2],
        remats=["save_qkv_context"], seq_len=CONTEXT_SEQ, attention="flash", jobs=1, cache_dir=cache,
        log=lambda line: None, refine=0,
    )  # fmt: skip
    square = sorted({s for s in re.findall(r"\w+\[[\d,]+\]", hlo) if s.count(str(CONTEXT_SEQ)) >= 2})
    collectives = [
        {"kind": c.kind.value, "count": c.count, "result_bytes": c.result_bytes, "group": list(c.group),
         "op_name": c.op_name}
        for c in step_collectives(hlo)
    ]  # fmt: skip
    results["context"] = {
        "report": report.to_dict(), "table": report.table(), "collectives": collectives, "square": square,
        "advice": advice.to_dict(), "advice_table": advice.table(), "code": advice.code(),
    }  # fmt: skip


def interrupted_advice(config: Path, out: Path, results: dict) -> None:
    """The advisor's CLI stopped by Ctrl-C after its first compile: its exit code and partial table."""
    import spmd.plan.advisor.compile_pool as pool

    compiled = []
    real = pool.compile_candidate

    def compile_then_interrupt(*args, **kwargs):
        if compiled:
            raise KeyboardInterrupt
        compiled.append(args[1])
        return real(*args, **kwargs)

    pool.compile_candidate = compile_then_interrupt
    try:
        code, stdout, stderr = run_cli(
            [str(config), "--topology", "v5e:2x2", "--advise", "--strategies", "fsdp,2d", "--tensors", "2",
             "--per-device-batches", "8", "--remats", "dots", "--seq", "128", "--jobs", "1", "--no-cache"]
        )  # fmt: skip
    finally:
        pool.compile_candidate = real
    results["interrupted"] = {"exit": code, "stdout": stdout, "stderr": stderr}


def every_plan(config: Path, out: Path, results: dict) -> None:
    """The advisor's search on one FSDP mesh (one compile at a time), and every plan it could have
    tried, each compiled: `EVERY_REMATS` x `EVERY_BATCHES`. One compile cache serves both, so a
    plan compiles once; the advice says which it compiled. It is `advisor`'s and
    `refined_advice`'s cache (they run first in one process, `plan_results.PARTS`): of the four
    plans, FSDP dots at 8 is `advisor`'s and full at 4 `refined_advice`'s, so two compile here."""
    from spmd.plan.advisor.advice import Candidate
    from spmd.plan.advisor.advisor import advise
    from spmd.plan.advisor.plan_cache import Settings, model_key, run_candidate
    from spmd.plan.request.settings import PlanSettings

    cache, quiet = out / ADVICE_CACHE, lambda line: None
    advice = advise(
        str(config), "v5e:2x2", strategies=["fsdp"], remats=EVERY_REMATS, per_device_batches=EVERY_BATCHES,
        seq_len=EVERY_SEQ, jobs=1, cache_dir=cache, log=quiet, refine=0,
    )  # fmt: skip
    shared = Settings(PlanSettings("v5e:2x2", 1, EVERY_SEQ), cache, model_key(str(config)))
    every = []
    for remat in EVERY_REMATS:
        for batch in EVERY_BATCHES:
            o = run_candidate(str(config), Candidate("fsdp", (("fsdp", 4),), batch, remat), shared, quiet)
            every.append({"remat": remat, "batch": batch, "report": o.report.to_dict()})
    results["every_plan"] = {"advice": advice.to_dict(), "every": every}


def refined_advice(config: Path, out: Path, results: dict) -> None:
    """The advisor's second pass through the CLI: `full` on one FSDP mesh, then the per-tensor
    variant of it with the highest ceiling, at the winner's batch and the next one up; then
    again, every compile from the cache (`advisor`'s, which compiled no `full`)."""
    args = lambda name: [  # noqa: E731
        str(config), "--topology", "v5e:2x2", "--advise", "--strategies", "fsdp", "--per-device-batches", "2,4",
        "--remats", "full", "--seq", "128", "--refine", "1", "--jobs", "1", "--cache", str(out / ADVICE_CACHE),
        "--json", str(out / name),
    ]  # fmt: skip
    code, stdout, stderr = run_cli(args("refined.json"))
    again, _, again_stderr = run_cli(args("refined_again.json"))
    results["refined"] = {
        "exit": code, "stdout": stdout, "stderr": stderr, "again_exit": again, "again_stderr": again_stderr,
        "advice": json.loads((out / "refined.json").read_text()),
        "again": json.loads((out / "refined_again.json").read_text()),
    }  # fmt: skip


def ironwood(config: Path, out: Path, results: dict) -> None:
    """The issue's first check: a config.json on tpu7x:2x2x1 through the CLI (the current lane),
    or the error that names the current lane (the torch_xla lane's libtpu knows no tpu7x)."""
    code, stdout, stderr = run_cli(
        [str(config), "--topology", "tpu7x:2x2x1", "--seq", "128", "--json", str(out / "ironwood.json")]
    )
    results["ironwood"] = {"exit": code, "stdout": stdout, "error": stderr.strip().splitlines()[-1:]}


def device_orders(results: dict) -> None:
    """The planner's mesh on tpu7x:2x4x4 (64 devices) for fsdp=32 x tensor=2, over libtpu's own
    devices: the device ids in mesh order, the chip of each, and the order the report names. jax
    0.12 puts each tensor pair on one chip's two cores, 0.10.2 on two chips along x."""
    from spmd.plan._jax_compat import toolchain
    from spmd.plan.request.meshes import build_mesh, tpu_devices
    from spmd.plan.request.topology import parse_slice

    target = parse_slice("tpu7x:2x4x4")
    try:
        devices = tpu_devices(target)
    except ShardingError as e:  # libtpu 0.0.20 (the torch_xla lane) knows no tpu7x
        results["device_orders"] = {"error": [type(e).__name__, str(e)]}
        return
    ids = [int(i) for i in build_mesh({"fsdp": 32, "tensor": 2}, target, devices).device_ids]
    chips = [list(devices[i].coords) for i in ids]
    results["device_orders"] = {"ids": ids, "chips": chips, "device_order": toolchain(devices).device_order}


def errors(results: dict) -> None:
    """Bad input that needs libtpu or the tracer: each a typed error naming the fix."""
    found = {}
    for name, call in {
        "untraceable": lambda: plan("tests.spmd.plan.models_for_tests:branchy", "v5e:2x2", seq_len=64),
        "bad_shape": lambda: plan("gpt2", "v5e:3x3"),
    }.items():
        try:
            call()
            found[name] = None
        except ShardingError as e:
            found[name] = [type(e).__name__, str(e)]
    results["errors"] = found


def loop_collectives(results: dict) -> None:
    """The collectives parser on a program whose collectives are known: 5 all-gathers in a loop, one psum."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh as JaxMesh
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as JP

    from spmd.plan._jax_compat import compile_with_hlo, topology_devices
    from spmd.plan.compile.program import step_collectives

    mesh = JaxMesh(np.array(topology_devices("v5e:2x2", 1, "TPU v5e")).reshape(4), ("x",))

    def body(x):
        def step(i, acc):
            return acc + jax.lax.all_gather(x * i, "x", tiled=True)[: x.shape[0]]

        acc = jax.lax.fori_loop(0, 5, step, jnp.zeros_like(x))
        return jax.lax.psum(acc, "x")

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=JP("x", None), out_specs=JP(None, None), check_vma=False))
    arg = jax.ShapeDtypeStruct((4 * 256, 512), jnp.float32, sharding=NamedSharding(mesh, JP("x", None)))
    _, hlo, _ = compile_with_hlo(f.lower(arg))
    results["loop_collectives"] = [
        {"kind": c.kind.value, "count": c.count, "result_bytes": c.result_bytes, "group_size": c.group_size,
         "bytes_sent_per_device": c.bytes_sent_per_device}
        for c in step_collectives(hlo)
    ]  # fmt: skip


def _timed(results: dict, name: str, section: Callable[[], None]) -> None:
    """Run one section, recording its wall and CPU seconds (this process's and its finished
    children's, the advisor's compile processes) in results["seconds"] and the log: where the
    suite's longest wait goes."""
    t0, c0 = time.perf_counter(), _cpu()
    section()
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    results.setdefault("seconds", {})[name] = {"wall": round(wall, 1), "cpu": round(cpu, 1)}
    print(f"plan_worker: {name}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def fused_projections(config: Path, results: dict) -> None:
    """TINY (as many key/value heads as query heads) with its q/k/v and MLP input projections
    fused and apart, one 2-D step each on v5e:2x2 (dot attention, remat full): XLA's FLOPs and the
    matmuls of each program; and one Llama layer, with q/k/v biases, fused and apart on JAX's CPU."""
    import re

    from spmd.plan.api import plan_program
    from spmd.plan.request.settings import PlanSettings

    for fused in ("", "qkv,mlp"):
        settings = PlanSettings("v5e:2x2", 1, 128, "bfloat16", "dot", fused=fused)
        report, hlo = plan_program(
            str(config), settings, strategy="2d", mesh={"fsdp": 2, "tensor": 2}, global_batch=8, remat="full"
        )
        results[f"fused_{fused or 'none'}"] = {
            "flops": report.xla_flops, "matmul_flops": report.estimate.hardware_flops_per_device,
            "fits": report.fits, "fused": list(report.fused),
            "matmuls": len(re.findall(r"= \S+ (?:dot|convolution)\(", hlo)), "heading": report.table().splitlines()[0],
        }  # fmt: skip
    results["fused_numerics"] = _fused_layer_numerics()


def _fused_layer_numerics() -> dict:
    """A Llama layer's output with its projections fused (`fused_projections`) against the same
    layer in eager torch, and whether the members' forwards were replaced inside and restored after."""
    import numpy as np
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    from spmd.plan._jax_compat import import_torchax
    from spmd.plan.request.fused_projections import fused_projections as fused_forwards
    from spmd.plan.request.fused_projections import fusion_groups

    torch.manual_seed(0)
    config = LlamaConfig(**{**TINY, "hidden_size": 64, "intermediate_size": 96, "attention_bias": True})
    layer = LlamaDecoderLayer(config, 0).eval()
    x = torch.randn(2, 8, config.hidden_size)
    positions = LlamaRotaryEmbedding(config)(x, torch.arange(8)[None])
    want = layer(x, position_embeddings=positions)
    env = import_torchax().tensor.Environment()
    with env:
        params = {n: env.to_xla(p.detach()) for n, p in layer.named_parameters()}
        groups = fusion_groups(layer, ("qkv", "mlp"))
        with fused_forwards(groups, env):
            replaced = all("forward" in m.__dict__ for g in groups for m in g.members)
            got = torch.func.functional_call(
                layer, params, (env.to_xla(x),), {"position_embeddings": env.to_xla(positions)}
            )
        restored = all("forward" not in m.__dict__ for g in groups for m in g.members)
    got, want = (v[0] if isinstance(v, tuple) else v for v in (got, want))
    error = float(np.abs(np.asarray(env.t2j_iso(got)) - want.detach().numpy()).max())
    return {"groups": [g.kind for g in groups], "replaced": replaced, "restored": restored, "error": error}


def _two_slices(config: Path, results: dict) -> None:
    # Two slices over DCN, 8 chips: data=4 (2 per slice) x fsdp=2, so half the FSDP axis of the
    # one-slice fsdp=4 plan, and a data axis across slices.
    two = plan(str(config), "v5e:2x2", slices=2, mesh={"data": 4, "fsdp": 2}, global_batch=32, seq_len=128)
    results["two_slices"] = two.to_dict()


def sections(config: Path, out: Path, results: dict) -> dict[str, Callable[[], None]]:
    """Every section by name, in the order one process runs them: ``context_parallel`` reads the
    config ``fidelity`` writes, and ``every_plan`` the compiles ``advisor`` and ``refined_advice``
    cached."""
    return {
        "advisor": lambda: advisor(config, out, results),
        "refined_advice": lambda: refined_advice(config, out, results),
        "every_plan": lambda: every_plan(config, out, results),
        "two_slices": lambda: _two_slices(config, results),
        "policies_and_kernels": lambda: policies_and_kernels(config, results),
        "ironwood": lambda: ironwood(config, out, results),
        "device_orders": lambda: device_orders(results),
        "errors": lambda: errors(results),
        "loop_collectives": lambda: loop_collectives(results),
        "fidelity": lambda: fidelity(out, results),
        "context_parallel": lambda: context_parallel(out, results),
        "interrupted_advice": lambda: interrupted_advice(config, out, results),
        "fused_projections": lambda: fused_projections(config, results),
    }


def main(out: Path, names: list[str]) -> None:
    """Run the sections ``names`` (all if none) and write their results to OUT/results.json, or
    to OUT/results-NAME.json for the first one named, so processes sharing OUT write apart."""
    config = out / "tiny_llama.json"
    partial = out / f".tiny_llama.json.{os.getpid()}"  # processes sharing OUT replace it atomically
    partial.write_text(json.dumps(TINY))
    os.replace(partial, config)
    results: dict = {}
    every = sections(config, out, results)
    unknown = [n for n in names if n not in every]
    if unknown:
        raise SystemExit(f"plan_worker.py: no section {unknown}; the sections are {list(every)}")
    for name, section in every.items():
        if not names or name in names:
            _timed(results, name, section)
    done = out / (f"results-{names[0]}.json" if names else "results.json")
    done.with_suffix(".partial").write_text(json.dumps(results))
    os.replace(done.with_suffix(".partial"), done)


if __name__ == "__main__":  # --jobs 2 spawns processes that import this module
    main(Path(sys.argv[1]), sys.argv[2:])
