"""The advisor's search without a compiler: which candidates it compiles, given our memory math
and the compiler's verdicts (stand-ins here), how many compiles it runs at once, and Ctrl-C."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spmd.plan.advisor.compile_pool as pool
from spmd.plan.advisor.advice import Candidate, Outcome
from spmd.plan.advisor.compile_pool import COMPILE_HOST_BYTES, RESERVE_BYTES, default_jobs, run_searches
from spmd.plan.advisor.search import Leader, MeshSearch
from spmd.plan.predict.memory import MemoryMath

GIB = 2**30
BUDGET = 96 * GIB
MESH = (("fsdp", 128),)
# Per policy, GiB per device at one sequence per device, growing with the batch.
PER_SEQUENCE = {"none": 400, "dots": 120, "save_dot_except_mlp": 46, "save_qkv_proj": 35, "full": 21, "offload": 5}
REMATS = tuple(PER_SEQUENCE)


def math(remat, batch):
    return MemoryMath(arguments=6 * GIB, saved=int(PER_SEQUENCE[remat] * batch * GIB), working=0)


class Report:
    """The part of a PlanReport the search reads: the verdict and the predicted MFU."""

    def __init__(self, fits, mfu=0.0):
        self.fits, self.mfu = fits, mfu


def run(search, compiler_fits):
    """Drive ``search`` with ``compiler_fits(remat, batch)`` as the compiler; the candidates compiled."""
    compiled = []
    while (c := search.next()) is not None:
        compiled.append((c.remat, c.per_device_batch))
        search.record(Outcome(c, Report(compiler_fits(c.remat, c.per_device_batch))))
    return compiled


def test_a_right_memory_math_settles_each_policy_with_one_compile_and_a_check():
    search = MeshSearch("fsdp", MESH, (1, 2, 4), REMATS, BUDGET, math)
    compiled = run(search, lambda remat, batch: math(remat, batch).total <= BUDGET)
    # none and dots: over the line by our math, never compiled; save_dot_except_mlp fits 1 (2 is
    # 98 GiB, close to the line: compiled and refused); save_qkv_proj fits 2 (4 is 146 GiB: not
    # tried); full fits 4, the largest batch, so offload is never needed.
    assert compiled == [("save_dot_except_mlp", 1), ("save_dot_except_mlp", 2), ("save_qkv_proj", 2), ("full", 4)]
    skipped = {o.candidate.remat: o.skipped for o in search.outcomes if o.report is None}
    assert set(skipped) == {"none", "dots"}
    assert skipped["dots"].startswith("not compiled: our memory math gives 126.00 GiB/device (arguments 6.00")
    assert "more than 1.15 x the budget (96.00 GiB)" in skipped["dots"]


def test_when_the_compiler_disagrees_the_batch_is_bisected():
    # The compiler refuses everything above one sequence per device, whatever our math says.
    search = MeshSearch("fsdp", MESH, (1, 2, 4, 8, 16), ("full",), 10**6 * GIB, math)
    compiled = run(search, lambda remat, batch: batch <= 1)
    # The math's guess (16) first, then halving towards the largest that fits.
    assert compiled == [("full", 16), ("full", 2), ("full", 1)]


def test_a_model_of_no_known_shape_compiles_smallest_first():
    search = MeshSearch("fsdp", MESH, (1, 2, 4), ("dots", "full"), BUDGET, lambda remat, batch: None)
    compiled = run(search, lambda remat, batch: batch <= (2 if remat == "full" else 1))
    assert compiled == [("dots", 1), ("dots", 2), ("full", 2), ("full", 4)]


def test_left_never_undercounts():
    search = MeshSearch("fsdp", MESH, (1, 2, 4), REMATS, BUDGET, math)
    counts = []
    while (c := search.next()) is not None:
        counts.append(search.left())
        search.record(Outcome(c, Report(math(c.remat, c.per_device_batch).total <= BUDGET)))
    # At the first compile (3 more followed): its own bisection (2), one for each later policy our
    # math leaves a batch (3); at most every such batch (2 + 2 + 3 + 3). Never fewer than followed.
    assert counts[0] == (5, 10) and all(likely <= most for likely, most in counts)
    assert all(most >= len(counts) - 1 - k for k, (_, most) in enumerate(counts))
    assert search.left() == (0, 0)


def test_a_search_refuses_an_outcome_it_did_not_ask_for():
    search = MeshSearch("fsdp", MESH, (1,), ("full",), BUDGET, math)
    c = search.next()
    with pytest.raises(RuntimeError, match="is not the candidate waiting"):
        search.record(Outcome(search.candidate("dots", 1), Report(True)))
    search.record(Outcome(c, Report(True)))
    assert search.next() is None


@pytest.mark.parametrize(
    ("cores", "free", "jobs"),
    [
        (2, 24 * GIB, 2),  # this machine, idle: one per core
        (8, 7 * GIB, 2),  # memory-bound: (7 - 2) GiB at 2.5 GiB a compile
        (8, 3 * GIB, 1),  # never fewer than one
        (4, None, 4),  # no /proc/meminfo: cores alone
    ],
)
def test_the_pool_is_sized_by_cores_and_free_memory(monkeypatch, cores, free, jobs):
    monkeypatch.setattr(pool.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(pool, "_available_bytes", lambda: free)
    assert default_jobs() == jobs
    assert COMPILE_HOST_BYTES == 2.5 * GIB and RESERVE_BYTES == 2 * GIB


def test_ctrl_c_stops_the_searches_and_keeps_what_was_done(monkeypatch):
    calls = []

    def compile_candidate(model, c, settings, log):
        if calls:
            raise KeyboardInterrupt
        calls.append(c)
        return Outcome(c, Report(True))

    monkeypatch.setattr(pool, "compile_candidate", compile_candidate)
    monkeypatch.setattr(pool, "cached_outcome", lambda c, s, log: None)
    searches = [MeshSearch("fsdp", MESH, (1, 2), ("full",), BUDGET, math) for _ in range(2)]
    lines = []
    assert run_searches("gpt2", searches, None, 1, lines.append) is True
    assert [len(s.outcomes) for s in searches] == [1, 0]
    assert lines[0].startswith("[advisor: 1 plans done (0 cached), about 1 left (at most 2), about 0 s to go]")
    assert lines[-1] == "advisor: interrupted after 1 plans; the table is partial"


# -- plans that cannot win ---------------------------------------------------------------
# MFU ceilings by policy, non-increasing with recomputation as `spmd.plan.predict.ceiling` gives them.
CEILING = {"none": 0.77, "dots": 0.77, "save_dot_except_mlp": 0.66, "save_qkv_proj": 0.66, "full": 0.63,
           "offload": 0.63}  # fmt: skip


def test_a_policy_whose_ceiling_is_below_a_fitting_plan_is_not_compiled():
    # fsdp fits dots at batch 1 at 70 % MFU: full (at most 63 %) cannot win, whatever batch fits.
    leader = Leader()
    fits = lambda remat, batch: remat != "dots" or batch == 1  # noqa: E731
    search = MeshSearch("fsdp", MESH, (1, 2, 4), ("dots", "full"), BUDGET, lambda r, b: None, CEILING.get, leader)
    compiled = []
    while (c := search.next()) is not None:
        compiled.append((c.remat, c.per_device_batch))
        search.record(Outcome(c, Report(fits(c.remat, c.per_device_batch), 0.70)))
    assert compiled == [("dots", 1), ("dots", 2)]
    (skipped,) = [o.skipped for o in search.outcomes if o.report is None]
    assert skipped == (
        "not compiled: cannot win: its predicted MFU is at most 63.0 % (spmd.plan.predict.ceiling), below the 70.0 % of "
        "fsdp fsdp=128 · batch 1 · remat dots"
    )
    assert search.left() == (0, 0) and leader.mfu == 0.70


def test_a_plan_of_another_mesh_ends_a_search_mid_policy():
    leader = Leader()
    two_d = MeshSearch("2d", (("fsdp", 32), ("tensor", 4)), (1, 2), ("full",), BUDGET, lambda r, b: None,
                       CEILING.get, leader)  # fmt: skip
    two_d.record(Outcome(two_d.next(), Report(True, 0.40)))
    c = two_d.next()  # full at batch 2, waiting to compile, when the other mesh's plan arrives
    fsdp = MeshSearch("fsdp", MESH, (1,), ("dots",), BUDGET, lambda r, b: None, CEILING.get, leader)
    fsdp.record(Outcome(fsdp.next(), Report(True, 0.65)))
    assert (c.remat, c.per_device_batch) == ("full", 2) and two_d.withdraw_if_beaten() is True
    assert two_d.next() is None and [o.report is None for o in two_d.outcomes] == [False, True]
    assert "below the 65.0 % of fsdp fsdp=128 · batch 1 · remat dots" in two_d.outcomes[1].skipped


def test_a_mesh_whose_plans_run_less_than_their_floor_rules_nothing_out():
    # Where the step-time model misses matmuls (2-D plans of Llama-3.1-70B count 0.52 x the
    # model's FLOPs), a prediction can pass its ceiling: that mesh's policies are all compiled.
    leader = Leader()
    leader.offer(Outcome(Candidate("fsdp", MESH, 1, "dots"), Report(True, 0.70)))
    for counted, compiled in ((lambda o: False, [("dots", 1), ("dots", 2), ("full", 2)]),
                              (lambda o: True, [("dots", 1), ("dots", 2)])):  # fmt: skip
        search = MeshSearch("2d", MESH, (1, 2), ("dots", "full"), BUDGET, lambda r, b: None, CEILING.get, leader,
                            counted)  # fmt: skip
        assert run(search, lambda remat, batch: batch == 1 or remat == "full") == compiled


def test_nothing_is_ruled_out_before_the_mesh_s_own_first_plan():
    leader = Leader()
    leader.offer(
        Outcome(MeshSearch("fsdp", MESH, (1,), ("dots",), BUDGET, math).candidate("dots", 1), Report(True, 0.9))
    )
    search = MeshSearch("2d", MESH, (1,), ("full",), BUDGET, lambda r, b: None, CEILING.get, leader)
    assert search.next() is not None and search.withdraw_if_beaten() is False


def winner(searches):
    fitting = [o for s in searches for o in s.outcomes if o.fits]
    best = max(fitting, key=lambda o: o.report.mfu, default=None)
    return None if best is None else (best.candidate, best.report.mfu)


plan_tables = st.fixed_dictionaries(
    {
        (mesh, remat, batch): st.tuples(st.booleans(), st.floats(0.05, 1.0))
        for mesh in ("fsdp", "2d")
        for remat in REMATS
        for batch in (1, 2, 4)
    }
)


@settings(max_examples=200, deadline=None)
@given(plan_tables)
def test_ruling_out_what_cannot_win_keeps_the_winner(table):
    """Any compiler verdicts, any predicted MFUs under their policy's ceiling: the search that rules
    out what cannot win picks the winner of the same search without it, with no more compiles."""

    def searches(ceiling):
        leader = Leader()
        return [MeshSearch(m, ((m, 4),), (1, 2, 4), REMATS, BUDGET, math, ceiling, leader) for m in ("fsdp", "2d")]

    def drive(found):  # the meshes take turns, as the worker pool's searches do
        compiled, active = 0, list(found)
        while active:
            for s in list(active):
                c = s.next()
                if c is None:
                    active.remove(s)
                    continue
                fits, share = table[(s.strategy, c.remat, c.per_device_batch)]
                s.record(Outcome(c, Report(fits, share * CEILING[c.remat])))
                compiled += 1
        return compiled

    pruned, every = searches(CEILING.get), searches(lambda remat: None)
    assert drive(pruned) <= drive(every)
    assert winner(pruned) == winner(every)


def test_a_warm_advice_compiles_nothing_cold_ruled_out(monkeypatch):
    # Cold, the 2-D plan (70 %) ended the fsdp search before full was compiled. Warm, the fsdp
    # search is read first and reaches full at batch 2 (not in the cache); the 2-D plan read next
    # beats it, so full is dropped before any worker starts.
    leader = Leader()
    fsdp = MeshSearch("fsdp", MESH, (1, 2), ("dots", "full"), BUDGET, lambda r, b: None, CEILING.get, leader)
    two_d = MeshSearch("2d", (("tensor", 4),), (1,), ("dots",), BUDGET, lambda r, b: None, CEILING.get, leader)
    cache = {
        ("fsdp", "dots", 1): Report(True, 0.5),
        ("fsdp", "dots", 2): Report(False),
        ("2d", "dots", 1): Report(True, 0.7),
    }

    def cached(c, settings, log):
        found = cache.get((c.strategy, c.remat, c.per_device_batch))
        return None if found is None else Outcome(c, found, cached=True)

    monkeypatch.setattr(pool, "cached_outcome", cached)
    monkeypatch.setattr(pool, "ProcessPoolExecutor", None)  # calling it would fail the test
    assert run_searches("gpt2", [fsdp, two_d], None, 2, lambda line: None) is False
    assert [o.cached for o in fsdp.outcomes] == [True, True, False]
    assert fsdp.outcomes[2].candidate.remat == "full" and "cannot win" in fsdp.outcomes[2].skipped
    assert two_d.outcomes[0].cached
