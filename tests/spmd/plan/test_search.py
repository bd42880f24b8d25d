"""The advisor's search without a compiler: which candidates it compiles, given our memory math
and the compiler's verdicts (stand-ins here), how many compiles it runs at once, and Ctrl-C."""

import pytest

import spmd.plan.compile_pool as pool
from spmd.plan.advice import Outcome
from spmd.plan.compile_pool import COMPILE_HOST_BYTES, RESERVE_BYTES, default_jobs, run_searches
from spmd.plan.memory import MemoryMath
from spmd.plan.search import MeshSearch

GIB = 2**30
BUDGET = 96 * GIB
MESH = (("fsdp", 128),)
# Per policy, GiB per device at one sequence per device, growing with the batch.
PER_SEQUENCE = {"none": 400, "dots": 120, "save_dot_except_mlp": 46, "save_qkv_proj": 35, "full": 21, "offload": 5}
REMATS = tuple(PER_SEQUENCE)


def math(remat, batch):
    return MemoryMath(arguments=6 * GIB, saved=int(PER_SEQUENCE[remat] * batch * GIB), working=0)


class Report:
    """The part of a PlanReport the search reads: the verdict."""

    def __init__(self, fits):
        self.fits = fits


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
