"""A causal llama-style model (examples/train_long_context.py: grouped-query attention, rotary
positions, FSDP over fsdp x context) trains with context parallelism 2 and 4, and with context
parallelism 2 x tensor parallelism 2, to the losses of the run without either, in float32, and
each parameter's gradient is the same; a CP 4 run's checkpoint resumes at CP 2 and CP 1 with the
losses of the run never stopped: on DTensor (4 gloo ranks, tests/workers/long_context_worker.py)
and on torch_xla (8 devices, in this process)."""

import json

import pytest
import torch

from tests.torchrun import ROOT, WORKERS, warm_launch

WORKER = WORKERS / "long_context_worker.py"


@pytest.fixture(scope="module")
def dtensor(tmp_path_factory):
    out = tmp_path_factory.mktemp("long_context")
    launch = warm_launch(WORKER, 4, str(out), timeout=900)
    assert launch.returncode == 0, launch.stderr[-4000:]
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize(
    "run, without",
    [
        ("cp 2", "cp 1"),
        ("cp 4", "cp 1"),
        ("cp 4, no load balance", "cp 1"),
        ("cp 2, checkpointing", "cp 1"),  # backward recomputes each block, its attention too
        ("cp 4, deferred init", "cp 1, deferred init"),
        ("cp 2 x tp 2", "cp 1"),  # fsdp 1 x context 2 x tensor 2: torch's parallelize_module, then FSDP2
        ("cp 2 x tp 2, deferred init", "cp 1, deferred init"),
    ],
)
def test_dtensor_losses_equal_the_run_without_context_parallelism(dtensor, run, without):
    reference, losses = dtensor["losses"][without], dtensor["losses"][run]
    assert len(losses) == len(reference) == 10
    assert losses == pytest.approx(reference, rel=1e-5)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("run", ["cp 2 x tp 1", "cp 4 x tp 1", "cp 2 x tp 2"])
def test_dtensor_gradients_equal_per_parameter(dtensor, run):
    reference, grads = dtensor["gradients"]["cp 1 x tp 1"], dtensor["gradients"][run]
    assert reference.keys() == grads.keys()
    for name in reference:
        expected, got = torch.tensor(reference[name]), torch.tensor(grads[name])
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max()), name


@pytest.mark.parametrize(
    "saved, resumed, uninterrupted",
    [
        ("cp 4, saved at 5", "cp 2, resumed at 5", "cp 4"),
        ("cp 4, saved at 5", "cp 1, resumed at 5", "cp 4"),
        ("cp 2 x tp 2, saved at 5", "cp 4, resumed from cp 2 x tp 2 at 5", "cp 2 x tp 2"),
    ],
)
def test_dtensor_a_checkpoint_resumes_at_other_context_sizes(dtensor, saved, resumed, uninterrupted):
    """Saved after 5 steps (model and AdamW, each rank its shards), resumed on another mesh:
    steps 5 to 9 give the losses of the run never stopped."""
    losses = dtensor["losses"]
    assert losses[saved] == pytest.approx(losses[uninterrupted][:5], rel=1e-5)
    assert len(losses[resumed]) == 5
    assert losses[resumed] == pytest.approx(losses[uninterrupted][5:], rel=1e-5)


def test_dtensor_tensor_parallelism_over_an_fsdp_axis_is_refused_with_the_fix(dtensor):
    message = dtensor["refusals"]["tensor parallel over an fsdp axis"]
    assert "FSDP shards or replicates it over 'context' too" in message, message
    assert "ParallelDims(..., tensor=n)" in message


def _example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_long_context", ROOT / "examples" / "train_long_context.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--tensor", "4"], "--tensor 4 must divide --kv-heads 2: each tensor shard computes whole key/value heads"),
        (["--save-every", "5"], "--save-every needs --checkpoint-dir"),
    ],
)
def test_the_example_refuses_what_cannot_run_before_starting(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        _example().parse_args(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


SMALL_XLA = "--seq 64 --batch 8 --d-model 64 --layers 2 --lr 1e-3 --backend torch_xla".split()


@pytest.mark.torch_xla
def test_torch_xla_losses_equal_the_run_without_context_parallelism(xla):
    example = _example()
    reference = example.main([*SMALL_XLA, "--context", "1"])
    # fsdp 4 x context 2, fsdp 2 x context 4, and fsdp 2 x context 2 x tensor 2
    for run in (["--context", "2"], ["--context", "4"], ["--context", "2", "--tensor", "2"]):
        losses = example.main([*SMALL_XLA, *run])
        assert losses == pytest.approx(reference, rel=1e-5), run
    assert reference[-1] < reference[0]


@pytest.mark.torch_xla
def test_torch_xla_gradients_equal_per_parameter(xla):
    from spmd import P, get_sharding
    from spmd.sharding._named_sharding import hlo_sharding_for

    example = _example()

    def gradients(context, tensor=1):
        args = example.parse_args([*SMALL_XLA, "--context", str(context), "--tensor", str(tensor)])
        devices, _ = example.start_runtime("torch_xla")
        dims = example.ParallelDims.for_world(devices, context=context, tensor=tensor)
        model, plan, _ = example.build(args, dims)
        batch = example.split_batch(plan, dims, example.synthetic_tokens(0, 8, 64, args.vocab))
        logits = model(batch["input_ids"], batch["position_ids"])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).backward()
        if tensor > 1:  # stored over tensor (heads) and FSDP's fsdp x context (the model width)
            q = model.layers[0].attn.q_proj.weight
            assert get_sharding(q) == hlo_sharding_for(plan.mesh, P("tensor", ("fsdp", "context")), 2)
        return {name: p.grad.cpu() for name, p in model.named_parameters()}

    reference = gradients(1)
    for context, tensor in ((2, 1), (4, 1), (2, 2)):
        grads = gradients(context, tensor)
        assert grads.keys() == reference.keys()
        for name, expected in reference.items():
            assert torch.allclose(grads[name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max()), (context, name)


@pytest.mark.torch_xla
def test_torch_xla_a_cp_4_checkpoint_resumes_at_cp_2_and_cp_1(xla, tmp_path):
    example = _example()
    uninterrupted = example.main([*SMALL_XLA, "--context", "4"])
    resumed = [*SMALL_XLA, "--checkpoint-dir", str(tmp_path)]
    stopped = example.main([*resumed, "--context", "4", "--steps", "5", "--save-every", "5"])
    assert stopped == pytest.approx(uninterrupted[:5], rel=1e-5)
    for context in ("2", "1"):  # fsdp 4 x context 2, then fsdp 8
        assert example.main([*resumed, "--context", context]) == pytest.approx(uninterrupted[5:], rel=1e-5), context
