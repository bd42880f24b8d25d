"""Multi-process training on the dtensor backend (4 CPU ranks, gloo), in two torchrun launches.

The first gives each rank its own rows (make_global_tensor, make_global_batch, the errors) and
trains examples/train_fsdp.py from per-process loaders: its losses equal one process trained on
the same global batches, and are the reference of the second. The second runs the same training
under ``torchrun --max-restarts 3`` while ranks fail: rank 1 is SIGKILLed after step 10, then
rank 3 is SIGSTOPped, then rank 2 is SIGKILLed while the others wait for it in a collective;
every attempt resumes from the newest complete checkpoint and the run ends with the reference's
losses. benchmarks/kill_ranks.py kills ranks at random moments, in saves too;
benchmarks/stopped_rank_repeat.py repeats the stopped-rank test under load.

The second launch mostly waits (a stopped rank's timeout, torchrun's restarts), so it runs in the
background from the start of the session (tests/background.py), beside the other tests.
"""

import json
import re

import pytest

from tests.background import OWN_DIR, torchrun_in_background
from tests.torchrun import WORKERS, warm_launch

TRAIN = ["--backend", "dtensor", "--layers", "2", "--d-model", "64", "--seq", "32", "--vocab", "64"]
TRAIN += ["--batch", "16", "--steps", "16", "--dataset-rows", "512", "--lr", "1e-2"]
TIMEOUT = 10  # seconds a collective may wait (spmd.init_process_group's timeout)
FAULTS = "kill:1:10@0,stop:3:13@1,killmid:2:14@2"
FAULTY = torchrun_in_background(
    WORKERS / "train_fsdp_fault_worker.py", 4, OWN_DIR, FAULTS, *TRAIN, "--checkpoint-dir", f"{OWN_DIR}/ckpt",
    "--save-every", "4", "--timeout", str(TIMEOUT), max_restarts=3,
)  # fmt: skip


# Session-wide: the tests that read FAULTY run after the rest (tests/conftest.py), and one of them
# reads this too.
@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("multiprocess")
    run = warm_launch(WORKERS / "multiprocess_worker.py", 4, str(out), *TRAIN)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def faulty():
    run, out = FAULTY.completed(), FAULTY.directory
    attempts = {}
    for path in out.glob("attempt*-rank*.json"):
        record = json.loads(path.read_text())
        attempts[(record["attempt"], record["rank"])] = record
    return run, attempts, out / "ckpt"


def test_each_rank_s_rows_make_the_global_tensor(reference):
    assert reference["mismatches"] == [] and reference["cases"] >= 8  # 11 where torch orders groups (permuted mesh)
    assert reference["dict_ok"]


def test_per_process_input_errors_name_the_process_and_shapes(reference):
    errors = reference["errors"]
    assert errors["shapes"].startswith("LocalShapeMismatchError: make_global_tensor: the ranks passed different argu")
    assert "local shape: rank 2 (3, 5), ranks 0-1, 3 (2, 5)" in errors["shapes"]
    assert errors["indivisible"].startswith("IndivisibleBatchError: process_rows(spec P('data'), 10 rows along dim 0")
    assert (
        "process 0 of 4: 10 entries along dim 0 (the batch, for dim 0) do not split into 4 equal"
        in errors["indivisible"]
    )
    assert errors["missing"].startswith("MissingSpecError: make_global_batch: the batch's keys ['mask'] have no spec")


def test_four_ranks_with_per_process_loaders_train_as_one_process(reference):
    # Same weights and global batches; only the order of float sums differs.
    assert reference["fsdp_losses"] == pytest.approx(reference["eager_losses"], rel=1e-5)
    assert reference["fsdp_losses"][-1] < reference["fsdp_losses"][0]


@pytest.mark.reads(FAULTY)
def test_killed_and_stopped_ranks_cost_nothing(reference, faulty):
    run, attempts, _ = faulty
    assert run.returncode == 0, run.stderr[-4000:]
    assert sorted({a for a, _ in attempts}) == [0, 1, 2, 3]  # three failures, three restarts
    final = attempts[(3, 0)]
    assert final["end"] == "done"
    losses = {int(k): v for k, v in final["losses"].items()}
    assert losses[15] == pytest.approx(reference["fsdp_losses"][15], rel=1e-4)
    for attempt in range(4):  # every step any attempt ran gave the uninterrupted run's loss
        for step, loss in attempts[(attempt, 0)]["losses"].items():
            assert loss == pytest.approx(reference["fsdp_losses"][int(step)], rel=1e-4), (attempt, step)


@pytest.mark.reads(FAULTY)
def test_each_attempt_resumes_from_the_newest_complete_checkpoint(faulty):
    _, attempts, _ = faulty
    # killed after step 10: back to the save after step 7; stopped at step 13, killed in step 14:
    # back to 12.
    assert [attempts[(a, 0)]["first_step"] for a in range(4)] == [0, 8, 12, 12]
    assert attempts[(1, 0)]["positions"]["8"] == attempts[(0, 0)]["positions"]["8"]  # the same data position


@pytest.mark.reads(FAULTY)
def test_restarted_attempts_go_on_pruning_their_own_run_s_versions(faulty):
    _, _, ckpt = faulty
    # Saves after steps 4 and 8 (attempt 0), 12 (attempt 1), 16 (attempt 3), keep=2: each attempt
    # loaded the checkpoint first, so continued its lineage and removed the older ones.
    versions = sorted(ckpt.glob("v-*"))
    assert len(versions) == 2
    steps = sorted(json.loads((v / "index.json").read_text())["extra"]["step"] for v in versions)
    assert steps == [12, 16]


@pytest.mark.reads(FAULTY)
def test_a_stopped_rank_ends_the_others_with_a_clear_error_within_the_timeout(faulty):
    _, attempts, _ = faulty
    stopped = attempts[(1, 3)]
    assert stopped["end"] == "stopped"
    for rank in (0, 1, 2):
        # Whichever rank times out first closes its connections, so a rank still waiting may
        # read "Connection closed by peer" before its own timeout: a PeerLostError, same diagnosis.
        record = attempts[(1, rank)]
        end = record["end"]
        assert end.startswith(("CollectiveTimeoutError: step 13: ", "PeerLostError: step 13: ")), end
        assert "did not complete within the timeout" in end or "lost its connection to" in end
        assert re.search(r"step 13: \w+ #\d+ on group '\w+' \(ranks \[0, 1, 2, 3\]\)", end), end
        assert "rank 3: its heartbeat stopped (last at 'after step 12')" in end
        assert record["failed_at"] - stopped["stopped_at"] < TIMEOUT + 5


@pytest.mark.reads(FAULTY)
def test_a_rank_killed_mid_collective_is_named_by_every_surviving_rank(faulty):
    _, attempts, _ = faulty
    killed = attempts[(2, 2)]
    assert killed["end"] == "killed"
    ends = {rank: attempts[(2, rank)]["end"] for rank in (0, 1, 3)}
    # The ranks waiting on rank 2 read its connection close: a PeerLostError. A rank waiting only
    # on them (in gloo's ring, rank 0) reads theirs close when their processes exit, 4 to 6 s
    # after their reports under load (torch's teardown, measured on main too), or its own timeout
    # comes first: either error, the same diagnosis. torchrun's SIGTERM waited for it.
    assert any(end.startswith("PeerLostError: ") for end in ends.values()), ends
    for rank, end in ends.items():
        assert end.startswith(("PeerLostError: step 14: ", "CollectiveTimeoutError: step 14: ")), end
        assert re.search(r"step 14: \w+ #\d+ on group '\w+' \(ranks \[0, 1, 2, 3\]\), .* did not complete", end), end
        assert "rank 2: its heartbeat stopped (last at 'after step 13')" in end
        if end.startswith("PeerLostError"):  # says the connection was lost, not that it timed out
            assert f"rank {rank} lost its connection to " in end and "no timeout passed" in end
            assert "within the timeout" not in end
        assert attempts[(2, rank)]["failed_at"] - killed["killed_at"] < TIMEOUT + 5
