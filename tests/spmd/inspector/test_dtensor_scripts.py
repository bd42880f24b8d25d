"""The dry run of scripts that never call ``fully_shard``: a tensor parallel plan in plain torch
(with an optimizer, and updating its weights by hand), and our examples that shard with
`spmd.mark_sharding` / `spmd.shard_parameters` or DTensor's vocabulary. Steps come from the
optimizer's step, or from backward where there is none."""

import sys

import pytest

pytest.importorskip("torch.distributed._tools.fsdp2_mem_tracker")

from spmd.inspector._dtensor_run import run_rank  # noqa: E402
from tests.spmd.inspector.dry_scripts import write_script  # noqa: E402
from tests.torchrun import ROOT  # noqa: E402

TP = ROOT / "tests" / "data" / "tensor_parallel.py"
D, HIDDEN, WORLD, BATCH = 64, 256, 4, 8
# Rank 1's parameters under the plan: fc1's rows and bias split 4 ways, fc2's columns split, its
# bias replicated; float32.
LOCAL_PARAMETER_BYTES = 4 * (HIDDEN // WORLD * D + HIDDEN // WORLD + D * HIDDEN // WORLD + D)

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12), reason="the DTensor lane (torch 2.15)")


def _tp_run(*flags):
    args = ["--d", str(D), "--hidden", str(HIDDEN), "--batch", str(BATCH), *flags]
    run = run_rank(TP, args, world=WORLD, rank=1, steps=2)
    assert not run.failure, run.failure
    assert [s.complete for s in run.steps] == [True, True] and run.root == "Sequential" and not run.fsdp
    return run


def test_a_tensor_parallel_plan_steps_at_its_optimizer():
    run = _tp_run()
    last = run.steps[-1]
    assert last.category_max["sharded_parameters"] == LOCAL_PARAMETER_BYTES
    assert last.category_max["sharded_gradients"] == LOCAL_PARAMETER_BYTES
    # AdamW's state: two moments per parameter and a step count (a 0-d float32) for each of the
    # 4, with what its step allocates while it runs (torch's tracker files that under the
    # optimizer too; test_dtensor_dry_run holds the amount to a real run's). Made in step 0's step.
    assert run.steps[0].category_max["optimizer_state"] == last.category_max["optimizer_state"]
    assert last.category_max["optimizer_state"] >= 2 * LOCAL_PARAMETER_BYTES + 4 * 4
    (reduce,) = [c for c in last.collectives if c.phase == "forward"]
    # RowwiseParallel sums fc2's partial outputs over the 4 ranks, in fc2's output hook: after
    # the module tracker has left fc2 ("2"), so it is filed under the root.
    assert (reduce.op, reduce.ranks, reduce.bytes_in) == ("all-reduce", (0, 1, 2, 3), BATCH * D * 4)
    assert reduce.module == "Sequential"


def test_without_an_optimizer_backward_ends_the_step():
    run = _tp_run("--no-optimizer")
    assert all(s.category_max["optimizer_state"] == 0 for s in run.steps)
    assert run.steps[-1].category_max["sharded_gradients"] == LOCAL_PARAMETER_BYTES
    assert len(run.steps[0].collectives) == len(run.steps[1].collectives) == 1


def test_micro_batches_stay_in_their_step():
    """Gradient accumulation: two forwards and backwards per optimizer step are one step."""
    run = _tp_run("--accumulate", "2")
    assert [[c.phase for c in s.collectives] for s in run.steps] == [["forward", "forward"]] * 2


@pytest.mark.parametrize(
    "script,args,groups",
    [
        # mark_sharding and shard_parameters on a (4, 2) ('data', 'model') mesh: rank 3 is (1, 1).
        pytest.param("train_spmd.py", [], {(2, 3), (1, 3, 5, 7)}, id="train_spmd"),
        # DTensor's vocabulary through spmd (init_device_mesh, distribute_module, distribute_tensor)
        # on a (2, 4) mesh: rank 3 is (0, 3).
        pytest.param("one_script.py", [], {(3, 7), (0, 1, 2, 3)}, id="one_script"),
    ],
)
def test_our_examples_without_fully_shard(script, args, groups):
    path = ROOT / "examples" / script
    run = run_rank(path, ["--backend", "dtensor", *args], world=8, rank=3, steps=2)
    assert not run.failure, f"{run.failure} at {run.failing_line}"
    assert [s.complete for s in run.steps] == [True, True] and not run.fsdp
    assert {c.ranks for c in run.steps[-1].collectives} <= groups | {tuple(range(8))}
    assert {c.ranks for c in run.steps[-1].collectives} & groups
    assert run.steps[-1].category_max["optimizer_state"] > 0
    # The only values read are the script's own (its logged loss), not spmd's checks or meshes.
    assert all(line.startswith(f"{path}:") for line in run.placeholders), run.placeholders


def test_the_hugging_face_trainer_example():
    """examples/hf_trainer_fsdp.py as it is: deferred init under the fake mode (a parameter is
    the fake tensor itself) and the Trainer's batches on ``cpu:0`` (the fake mode kept the index
    and refused ``cpu`` with ``cpu:0``) ended it in raw tracebacks from inside torch."""
    pytest.importorskip("transformers")
    run = run_rank(ROOT / "examples" / "hf_trainer_fsdp.py", [], world=4, rank=0, steps=2)
    assert not run.failure, f"{run.failure} at {run.failing_line}"
    assert [s.complete for s in run.steps] == [True, True] and run.fsdp and run.root == "GPT2LMHeadModel"
    assert {c.op for c in run.steps[-1].collectives} >= {"all-gather", "reduce-scatter"}


def test_a_fully_shard_model_called_under_no_grad_before_its_optimizer(tmp_path):
    """An evaluation before the optimizer is built: the tracker cannot start inside the call of
    a ``fully_shard``-ed module (it re-registers the hooks the call has read), and ended the run
    in a TypeError from inside FSDP."""
    script = write_script(tmp_path, "evaluates_first.py", before="with torch.no_grad():\n    model(torch.randn(8, 16))")
    run = run_rank(script, [], world=4, rank=0, steps=2)
    assert not run.failure, f"{run.failure} at {run.failing_line}"
    assert [s.complete for s in run.steps] == [True, True] and run.fsdp
    # FSDP leaves the root's weights gathered after a forward (no reshard after the root's), so
    # the first training step gathers nothing, as in a real run; the next one gathers again.
    assert [[c.op for c in s.collectives] for s in run.steps] == [["reduce-scatter"], ["all-gather", "reduce-scatter"]]


def test_a_fully_shard_model_trained_without_an_optimizer(tmp_path):
    """No optimizer: followed from the end of its first backward (a step ends at backward)."""
    update = "with torch.no_grad():\n    for p in model.parameters():\n        p.sub_(p.grad)\nmodel.zero_grad()"
    script = write_script(tmp_path, "by_hand.py", inside=update)
    text = script.read_text().replace("optimizer = torch.optim.AdamW(model.parameters())\n", "")
    script.write_text(text.replace("        optimizer.step()\n        optimizer.zero_grad()\n", ""))
    run = run_rank(script, [], world=4, rank=0, steps=2)
    assert not run.failure, f"{run.failure} at {run.failing_line}"
    assert [s.complete for s in run.steps] == [True, True] and run.fsdp
    assert all([c.op for c in s.collectives] == ["all-gather", "reduce-scatter"] for s in run.steps)


@pytest.mark.parametrize(
    "where",
    [
        pytest.param({"before": "model = torch.compile(model)"}, id="compiled-module"),
        pytest.param({"main": "torch.compile(train)(batches())"}, id="compiled-step"),
    ],
)
def test_a_compiled_model_or_step_runs_eagerly_and_says_so(tmp_path, where):
    """``torch.compile(model)`` of a ``fully_shard``-ed model ended the run in an AssertionError
    from inside torch's memory tracker; it now runs eagerly, and the report says where."""
    from spmd.inspector.checks import dry_run_issues

    script = write_script(tmp_path, "compiled.py", **where)
    run = run_rank(script, [], world=4, rank=0, steps=2)
    assert not run.failure, f"{run.failure} at {run.failing_line}"
    assert [s.complete for s in run.steps] == [True, True] and run.fsdp
    assert all([c.op for c in s.collectives] == ["all-gather", "reduce-scatter"] for s in run.steps)
    line = next(f"{script}:{n}" for n, text in enumerate(script.read_text().splitlines(), 1) if "torch.compile" in text)
    assert run.compiled == {line: 1}
    (finding,) = [f for f in dry_run_issues(run) if f.code.value == "compiled-eagerly"]
    assert finding.message.startswith(f"{line} calls torch.compile (1 time(s)): the dry run ran it eagerly")


def test_a_data_loader_with_worker_processes(tmp_path):
    """Its workers run in this process: as processes they got the fake tensors pickled and ended
    the run in a RuntimeError from inside torch (a meta tensor's storage set to a CPU one)."""
    before = "data = torch.utils.data.TensorDataset(torch.randn(64, 16))"
    main = "loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True)\ntrain(x for (x,) in loader)"
    script = write_script(tmp_path, "loads.py", before=before, main=main)
    run = run_rank(script, [], world=4, rank=0, steps=2)
    assert not run.failure, f"{run.failure} at {run.failing_line}"
    assert [s.complete for s in run.steps] == [True, True]
    assert run.steps[-1].category_max["inputs"] == 8 * 16 * 4  # the loader's batch of 8 rows reached the model
    assert run.placeholders == {}  # the iterator's seed for its workers is no read of the script's
