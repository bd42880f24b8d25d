"""A causal llama-style model (examples/train_long_context.py: grouped-query attention, rotary
positions, FSDP over fsdp x context) trains with context parallelism 2 and 4 to the losses of
the run without it, in float32, and each parameter's gradient is the same: on DTensor (4 gloo
ranks, tests/workers/long_context_worker.py) and on torch_xla (8 devices, in this process)."""

import json

import pytest
import torch

from tests.torchrun import ROOT, WORKERS, torchrun

WORKER = WORKERS / "long_context_worker.py"


@pytest.fixture(scope="module")
def dtensor(tmp_path_factory):
    out = tmp_path_factory.mktemp("long_context")
    launch = torchrun(WORKER, 4, str(out), timeout=900)
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
    ],
)
def test_dtensor_losses_equal_the_run_without_context_parallelism(dtensor, run, without):
    reference, losses = dtensor["losses"][without], dtensor["losses"][run]
    assert len(losses) == len(reference) == 10
    assert losses == pytest.approx(reference, rel=1e-5)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("context", ["2", "4"])
def test_dtensor_gradients_equal_per_parameter(dtensor, context):
    reference, grads = dtensor["gradients"]["1"], dtensor["gradients"][context]
    assert reference.keys() == grads.keys()
    for name in reference:
        expected, got = torch.tensor(reference[name]), torch.tensor(grads[name])
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max()), name


def _example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_long_context", ROOT / "examples" / "train_long_context.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.torch_xla
def test_torch_xla_losses_equal_the_run_without_context_parallelism(xla):
    example = _example()
    small = [
        "--seq",
        "64",
        "--batch",
        "8",
        "--d-model",
        "64",
        "--layers",
        "2",
        "--lr",
        "1e-3",
        "--backend",
        "torch_xla",
    ]
    reference = example.main([*small, "--context", "1"])
    for context in ("2", "4"):
        losses = example.main([*small, "--context", context])
        assert losses == pytest.approx(reference, rel=1e-5), context
    assert reference[-1] < reference[0]


@pytest.mark.torch_xla
def test_torch_xla_gradients_equal_per_parameter(xla):
    example = _example()

    def gradients(context):
        small = ["--seq", "64", "--batch", "8", "--d-model", "64", "--layers", "2", "--backend", "torch_xla"]
        args = example.parse_args([*small, "--context", str(context)])
        devices, _ = example.start_runtime("torch_xla")
        dims = example.ParallelDims.for_world(devices, context=context)
        model, plan, _ = example.build(args, dims)
        batch = example.split_batch(plan, dims, example.synthetic_tokens(0, 8, 64, args.vocab))
        logits = model(batch["input_ids"], batch["position_ids"])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).backward()
        return {name: p.grad.cpu() for name, p in model.named_parameters()}

    reference = gradients(1)
    for context in (2, 4):
        grads = gradients(context)
        assert grads.keys() == reference.keys()
        for name, expected in reference.items():
            assert torch.allclose(grads[name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max()), (context, name)
