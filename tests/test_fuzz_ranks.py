"""A multi-process fuzz (issue 30, item 6): seeded trials of the collective entry points on 4 gloo
ranks, agreeing or with one rank differing in one field (tests/workers/rank_fuzz.py). Agreeing ranks
get one process's result; ranks that differ all raise the same RankDisagreementError naming the
field and the odd rank; no trial takes 30 s."""

import json
from collections import Counter

from tests.torchrun import WORKERS, warm_launch

WORKER = WORKERS / "agreement_worker.py"
SEED, TRIALS = 30, 48


def test_ranks_agree_or_fail_together(tmp_path):
    run = warm_launch(WORKER, 4, str(tmp_path), "fuzz", str(SEED), str(TRIALS), timeout=500)
    assert run.returncode == 0, run.stderr[-4000:]
    results = json.loads((tmp_path / "fuzz.json").read_text())
    assert len(results) == TRIALS
    broken = [r for r in results if r["verdict"] != "ok"]
    assert broken == [], broken[:5]
    kinds = Counter(r["odd"] is None for r in results)
    assert kinds[True] >= TRIALS // 4 and kinds[False] >= TRIALS // 4  # both halves of the property drawn
