"""Refusals leave things as they were on the dtensor backend, under torchrun (gloo, 2 ranks): a
wrap whose init fails on a later unit, and loads of checkpoints unlike the model or optimizer
(tests/workers/refusal_worker.py)."""

import json

import pytest

from tests.torchrun import WORKERS, warm_launch

CASES = ["wrap_rolls_back", "another_models_latest", "another_dtype", "another_optimizer"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("refusals")
    run = warm_launch(WORKERS / "refusal_worker.py", 2, str(out), timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("case", CASES)
def test_a_refusal_leaves_every_rank_as_it_was(results, case):
    assert [r[case] for r in results] == ["ok", "ok"]
