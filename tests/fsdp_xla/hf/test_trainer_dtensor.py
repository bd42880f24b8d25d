"""FSDPTrainer on DTensor under torchrun (4 ranks, gloo): examples/hf_trainer_fsdp.py's GPT-2 with
the blog's fsdp_config.json unchanged and deferred init trains with the torch_xla lane's losses,
checkpoints in the sharded format and resumes with the same losses; no rank writes a parameter's
unsharded values while the model is built and wrapped. One torchrun job (hf_trainer_worker.py)
serves every test here but the last two, which need no process group."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import HAS_TORCH_XLA
from tests.torchrun import ROOT, WORKERS, child_env, warm_launch

WORKER = WORKERS / "hf_trainer_worker.py"
TORCH_XLA_LOSSES = ROOT / "tests" / "data" / "hf_trainer" / "torch_xla_losses.json"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_trainer_dtensor")
    launch = warm_launch(WORKER, 4, str(out), timeout=900)
    assert launch.returncode == 0, launch.stderr[-4000:]
    return json.loads((out / "results.json").read_text()), out


def test_trains_with_the_torch_xla_lanes_losses(run):
    """The config computes in bfloat16, so the lanes agree to rounding: rel 1e-3 over 10 steps
    (the torch_xla run rounds each bf16 op as eager does; tests/data/hf_trainer/regenerate.py)."""
    if torch.__version__ < "2.15":
        pytest.skip(
            "the parity is the current lane's (torch 2.15); torch 2.9's eager bfloat16 kernels on DTensor land 1.17e-3 "
            "off the torch_xla run at step 9 (measured)"
        )
    result, _ = run
    expected = json.loads(TORCH_XLA_LOSSES.read_text())["losses"]
    losses = result["train"]["losses"]
    assert len(losses) == len(expected) == 10
    assert losses == pytest.approx(expected, rel=1e-3)
    assert losses[-1] < losses[0]


def test_resuming_from_a_checkpoint_gives_the_same_losses(run):
    result, out = run
    assert (out / "train" / "checkpoint-5" / "fsdp_xla" / "LATEST").is_file()  # our sharded format
    assert sorted(p.name for p in (out / "train" / "checkpoint-5").glob("rng_state_*.pth")) == [
        f"rng_state_{r}.pth" for r in range(4)
    ]
    train, resumed = result["train"]["losses"], result["resume"]["losses"]
    assert resumed[5:] == train[5:]  # steps 6-10 after loading model, optimizer, scheduler and RNG


def test_a_run_pointed_at_another_runs_output_directory_is_refused_before_it_writes(run):
    """It used to be refused at the optimizer's save, after the model's save had rewritten that
    run's checkpoint-5/config.json (another model's) and training_args.bin."""
    _, out = run
    launch = warm_launch(WORKER, 4, str(out), "foreign", timeout=600)
    assert launch.returncode == 0, launch.stderr[-4000:]
    foreign = json.loads((out / "foreign.json").read_text())
    for rank in foreign:
        assert rank["refusal"] is not None and "holds another run's checkpoint" in rank["refusal"], rank
        assert "Nothing was written" in rank["refusal"]
        assert rank["files"] > 5 and rank["changed"] == [], rank
    assert len({rank["refusal"] for rank in foreign}) == 1  # the same refusal on every rank


def test_no_rank_writes_a_parameters_unsharded_values_while_building_and_wrapping(run):
    """Deferred init: every host tensor written while the model is built on meta and wrapped is
    at most one rank's shard (each rank fills only its rows of each parameter)."""
    result, _ = run
    train = result["train"]
    for rank in result["per_rank"]:
        assert 0 < rank["largest_written_bytes"] <= rank["largest_shard_bytes"], rank
        assert rank["largest_written_bytes"] <= train["largest_param_bytes"] // 4, rank


def test_fsdp2_units_without_a_ddp_wrapper_computing_in_bf16(run):
    result, _ = run
    train = result["train"]
    assert train["backend"] == "dtensor"
    assert train["all_dtensor"] and train["param_dtypes"] == ["torch.float32"]  # float32 shards
    assert train["mp_param_dtype"] == "torch.bfloat16"  # the config's compute_dtype
    assert train["model_is_wrapped"] and train["wrapped_type"] == "FSDPGPT2LMHeadModel"  # no DDP around it


def test_each_rank_takes_its_rows_of_the_global_batch(run):
    result, _ = run
    parts = [rank["first_rows"] for rank in result["per_rank"]]
    assert [len(p) for p in parts] == [4, 4, 4, 4]  # per_device_train_batch_size=16 is the global batch
    rows = [tuple(r) for p in parts for r in p]
    assert len(set(rows)) == 16


def test_save_pretrained_writes_the_consolidated_model(run):
    from transformers import GPT2Config, GPT2LMHeadModel

    from fsdp_xla.checkpoint import consolidate

    _, out = run
    saved = load_file(out / "pretrained" / "model.safetensors")
    sharded = consolidate(out / "final" / "fsdp_xla")  # Trainer.save_model: the sharded format
    for name, value in saved.items():
        assert torch.equal(value, sharded[name]), name
    model = GPT2LMHeadModel.from_pretrained(out / "pretrained")
    assert isinstance(model.config, GPT2Config) and model.transformer.h[0].mlp.c_fc.weight.shape == (128, 512)
    assert torch.equal(model.transformer.wte.weight, sharded["transformer.wte.weight"])


def test_a_batch_that_does_not_divide_by_the_ranks_is_refused(run):
    result, _ = run
    assert "per_device_train_batch_size=6 is the global batch" in result["odd_batch"]
    assert "Use a multiple of 4." in result["odd_batch"]


@pytest.mark.skipif(HAS_TORCH_XLA, reason="without torch_xla only (the torch_xla lane runs the example on GSPMD)")
def test_the_example_without_torchrun_launches_its_ranks(tmp_path):
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hf_trainer_fsdp.py"), "--steps", "2", "--n-layer", "1"]
        + ["--output-dir", str(tmp_path / "out")],
        env=child_env(xla=False),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "launching 4 CPU processes (gloo)" in run.stdout
    assert "on dtensor" in run.stdout and "Traceback" not in run.stderr


@pytest.mark.skipif(HAS_TORCH_XLA, reason="without torch_xla only (with it, one process runs on GSPMD)")
def test_fsdp_trainer_without_a_process_group_or_torch_xla_says_to_use_torchrun(tmp_path):
    from transformers import TrainingArguments

    from fsdp_xla.hf import FSDPTrainer, HFConfigError

    args = TrainingArguments(output_dir=str(tmp_path), fsdp=True, fsdp_config={"xla": True}, report_to=[])
    with pytest.raises(HFConfigError, match=r"no torch.distributed process group and no torch_xla.*torchrun"):
        FSDPTrainer(model=torch.nn.Linear(2, 2), args=args)


def test_load_best_model_at_end_is_refused_on_dtensor(tmp_path):
    """It reloads the Trainer's weight files; FSDPTrainer's checkpoints there are sharded."""
    from transformers import TrainingArguments

    from fsdp_xla.hf import HFConfigError
    from fsdp_xla.hf._dtensor_backend import DTensorTrainerBackend

    args = TrainingArguments(
        output_dir=str(tmp_path),
        load_best_model_at_end=True,
        eval_strategy="steps",
        save_strategy="steps",
        report_to=[],
    )
    with pytest.raises(HFConfigError, match=r"load_best_model_at_end=True.*fsdp_xla.checkpoint.load_sharded"):
        DTensorTrainerBackend(None).before_trainer(args)
