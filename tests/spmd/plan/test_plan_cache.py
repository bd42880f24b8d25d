"""The advisor's compile cache: a damaged entry is a miss (compiled afresh), never a crash."""

import pytest

import spmd.plan.api
from spmd.plan.advisor.advice import Candidate
from spmd.plan.advisor.plan_cache import Settings, entry_path, model_key, run_candidate
from spmd.plan.errors import PlanError
from spmd.plan.request.settings import PlanSettings

CANDIDATE = Candidate("fsdp", (("fsdp", 4),), 1)


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_text('{"garbage": 1}'),  # KeyError: 'memory' from PlanReport.from_dict
        lambda p: p.write_text("{not json"),
        lambda p: p.write_text('{"memory": 5, "collectives": [], "estimate": {}}'),
        lambda p: p.mkdir(),  # a directory in the entry's place: neither read nor written
    ],
)
def test_a_damaged_cache_entry_is_compiled_afresh(tmp_path, monkeypatch, damage):
    settings = Settings(PlanSettings("v5e-4", 1, 32, "bfloat16", "dot", 16 * 2**30), tmp_path, model_key("gpt2"))
    path = entry_path(CANDIDATE, settings)
    damage(path)
    compiled = []

    def fake_plan(*args, **kwargs):
        compiled.append(args)
        raise PlanError("stand-in for the compile")

    monkeypatch.setattr(spmd.plan.api, "plan_with", fake_plan)
    lines = []
    outcome = run_candidate("gpt2", CANDIDATE, settings, lines.append)
    assert compiled and outcome.skipped == "not compiled: stand-in for the compile"
    assert "is damaged" in lines[0] and str(path) in lines[0], lines
