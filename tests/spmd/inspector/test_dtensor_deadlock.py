"""A dry run flags ranks that issue two groups' collectives in orders that block each other
(a real run deadlocks although each group's own sequence matches): the replay of the ranks'
logs, checked against the meeting graph's cycles, and the CLI on scripts that do it."""

import sys
from graphlib import CycleError, TopologicalSorter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch.distributed._tools.fsdp2_mem_tracker")

from spmd.inspector._dtensor.agreement import Issued  # noqa: E402
from spmd.inspector._dtensor.deadlock import coverage, find_deadlock, order_deadlock, stuck_at  # noqa: E402
from spmd.inspector.cli import main  # noqa: E402
from tests.spmd.inspector.dry_scripts import line_of, write_script  # noqa: E402

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12), reason="the DTensor lane (torch 2.15)")

WORLD, ROW0, ROW1, COL0, COL1 = (0, 1, 2, 3), (0, 1), (2, 3), (0, 2), (1, 3)


def on(group, line="", name=""):
    return Issued("all-reduce", group, "float32", line, name)


def test_two_ranks_ordering_two_shared_groups_differently_deadlock():
    logs = {0: [on(WORLD, "t.py:5"), on(ROW0, "t.py:6")], 1: [on(ROW0, "t.py:6"), on(WORLD, "t.py:5")]}
    assert stuck_at(logs) == {0: 0, 1: 0}
    found = order_deadlock(logs)
    assert (
        "rank 0 waits in all-reduce of float32 at t.py:5 on the group of ranks 0..3 (its collective #0 there) for rank 1"
        in found
    )
    assert (
        "rank 1 waits in all-reduce of float32 at t.py:6 on the group of ranks 0..1 (its collective #0 there) for rank 0"
        in found
    )
    assert "Issue collectives on different groups in the same order on every rank" in found


def test_two_groups_over_the_same_ranks_are_two_communicators():
    """The world (process group 0) and a group made over the same ranks (3) never meet: ranks
    that order them differently deadlock, and the message names which group is which."""
    logs = {r: [on(WORLD, "t.py:5", "0"), on(WORLD, "t.py:6", "3")] for r in WORLD}
    logs[1] = logs[1][::-1]
    assert stuck_at(logs) == {0: 0, 1: 0, 2: 0, 3: 0}
    found = order_deadlock(logs)
    assert "rank 0 waits in all-reduce of float32 at t.py:5 on process group 0 (ranks 0..3)" in found
    assert "rank 1 waits in all-reduce of float32 at t.py:6 on process group 3 (ranks 0..3)" in found
    same = {r: [on(WORLD, "t.py:5", "0"), on(WORLD, "t.py:6", "3")] for r in WORLD}
    assert order_deadlock(same) == "" and "across 2 groups" in coverage(same, 4)


def test_the_same_order_on_every_rank_finishes():
    logs = {r: [on(WORLD), on(ROW0 if r < 2 else ROW1)] for r in range(4)}
    assert stuck_at(logs) == {} and order_deadlock(logs) == ""


# Rows (0, 1), (2, 3), columns (0, 2), (1, 3) of a 2x2 mesh: ranks whose row + column is odd
# issue the column's all-reduce first. Every group's sequence matches, and 0 -> 1 -> 3 -> 2 -> 0
# wait for each other in a cycle through all four ranks.
CROSS = {0: [on(ROW0), on(COL0)], 1: [on(COL1), on(ROW0)], 2: [on(COL0), on(ROW1)], 3: [on(ROW1), on(COL1)]}


def test_a_cycle_through_four_ranks_is_named_in_order():
    found = find_deadlock(CROSS)
    assert found is not None and found.closed
    assert [(w.rank, w.waits_for) for w in found.cycle] == [(0, 1), (1, 3), (3, 2), (2, 0)]


def test_a_cycle_through_a_rank_not_run_is_not_claimed():
    """Rank 3 not run is assumed to meet ranks 1 and 2 whenever they arrive: no deadlock among
    0, 1, 2 alone, and the coverage says the cycle through others is not ruled out."""
    partial = {r: CROSS[r] for r in (0, 1, 2)}
    assert order_deadlock(partial) == ""
    assert "cannot be ruled out" in coverage(partial, 4)
    assert coverage(CROSS, 4) == ", and their order across 4 groups cannot deadlock"


def test_one_rank_swapping_row_and_column_alone_does_not_deadlock():
    """Rank 1 alone issuing its column first completes (rank 3 meets it there first)."""
    logs = {0: [on(ROW0), on(COL0)], 1: [on(COL1), on(ROW0)], 2: [on(ROW1), on(COL0)], 3: [on(ROW1), on(COL1)]}
    assert stuck_at(logs) == {}


def test_a_rank_waiting_for_one_that_finished_is_named():
    found = find_deadlock({0: [on(ROW0, "t.py:3")], 1: []})
    assert found is not None and not found.closed
    assert "for rank 1, which has issued all its collectives" in order_deadlock({0: [on(ROW0)], 1: []})


def test_coverage_is_silent_with_one_group():
    assert coverage({0: [on(WORLD)], 1: [on(WORLD)]}, 4) == ""


# Property tests: the groups of a 2x3 mesh (its rows, its columns and the world).
RANKS = range(6)
GROUPS = [tuple(RANKS), (0, 1, 2), (3, 4, 5), (0, 3), (1, 4), (2, 5)]


def _meeting_graph_has_cycle(logs):
    """The oracle: meetings (group, index) with an edge from each to the next on every rank's
    log; a real job finishes iff some order of meetings respects every rank's (no cycle)."""
    graph = {}
    for issued in logs.values():
        seen, previous = {}, None
        for i in issued:
            meeting = (i.ranks, seen.get(i.ranks, 0))
            seen[i.ranks] = meeting[1] + 1
            graph.setdefault(meeting, set())
            if previous is not None:
                graph[meeting].add(previous)
            previous = meeting
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError:
        return True
    return False


def _filtered(order, rank):
    return [on(GROUPS[g]) for g in order if rank in GROUPS[g]]


@given(st.lists(st.sampled_from(range(len(GROUPS))), max_size=12), st.sets(st.sampled_from(RANKS), min_size=1))
def test_every_rank_following_one_global_order_finishes(order, run):
    logs = {r: _filtered(order, r) for r in sorted(run)}
    assert stuck_at(logs) == {} and find_deadlock(logs) is None


@settings(max_examples=300)
@given(st.data(), st.sets(st.sampled_from(RANKS), min_size=1))
def test_the_replay_deadlocks_exactly_when_the_meetings_form_a_cycle(data, run):
    """Each rank interleaves its groups' sequences (the same on every member) in an order of its
    own; the replay leaves a rank blocked iff the meetings of the ranks run form a cycle."""
    counts = data.draw(st.lists(st.integers(0, 2), min_size=len(GROUPS), max_size=len(GROUPS)))
    logs = {}
    for r in sorted(run):
        mine = [g for g, n in enumerate(counts) if r in GROUPS[g] for _ in range(n)]
        logs[r] = [on(GROUPS[g]) for g in data.draw(st.permutations(mine))]
    found = find_deadlock(logs)
    assert (found is not None) == _meeting_graph_has_cycle(logs)
    if found is not None:
        assert found.closed  # the per-group counts agree: only a cycle blocks
        ranks = [w.rank for w in found.cycle]
        assert [w.waits_for for w in found.cycle] == ranks[1:] + ranks[:1]


@given(st.lists(st.sampled_from(range(len(GROUPS))), min_size=2, max_size=12), st.data())
def test_a_swap_of_two_groups_another_rank_shares_deadlocks(order, data):
    """From one global order, one rank swaps two consecutive collectives on groups that another
    rank also belongs to both of: that rank and this one wait for each other."""
    rank = data.draw(st.sampled_from(RANKS))
    logs = {r: _filtered(order, r) for r in RANKS}
    mine = logs[rank]
    places = [
        i
        for i in range(len(mine) - 1)
        if mine[i].ranks != mine[i + 1].ranks and len(set(mine[i].ranks) & set(mine[i + 1].ranks)) > 1
    ]
    assume(places)
    i = data.draw(st.sampled_from(places))
    mine[i], mine[i + 1] = mine[i + 1], mine[i]
    found = find_deadlock(logs)
    assert found is not None and found.closed
    assert rank in {w.rank for w in found.cycle}


# The CLI on scripts: the model's FSDP steps, then two all-reduces, on the world and on the
# group of the rank's row of a 2x2 mesh.
ROWS = "grid = init_device_mesh('cpu', (2, 2))\nrow = grid.get_group(1)"
WORLD_FIRST = "dist.all_reduce(loss.detach())\ndist.all_reduce(loss.detach(), group=row)"
ROW_FIRST = "dist.all_reduce(loss.detach(), group=row)\ndist.all_reduce(loss.detach())"


def _branch(condition, then, otherwise):
    return (
        f"if {condition}:\n"
        + "".join(f"    {line}\n" for line in then.splitlines())
        + "else:\n"
        + "".join(f"    {line}\n" for line in otherwise.splitlines())
    )


def test_two_ranks_ordering_the_world_and_their_row_differently_fail_the_dry_run(tmp_path, capsys):
    script = write_script(
        tmp_path, "swapped.py", before=ROWS, inside=_branch("dist.get_rank() == 1", ROW_FIRST, WORLD_FIRST)
    )
    assert main(["--world", "4", str(script)]) == 1
    out, err = capsys.readouterr()
    row_line = line_of(script, "dist.all_reduce(loss.detach(), group=row)")  # rank 1's, in the if
    world_line = line_of(script, "else:").rsplit(":", 1)  # rank 0's, first in the else
    world_line = f"{world_line[0]}:{int(world_line[1]) + 1}"
    assert f"rank 0 waits in all-reduce of float32 at {world_line} on the group of ranks 0..3" in err
    assert f"rank 1 waits in all-reduce of float32 at {row_line} on the group of ranks 0..1" in err
    assert "warning collective-order-deadlock:" in out


def test_a_new_group_over_the_world_s_ranks_is_not_the_world(tmp_path, capsys):
    """``dist.new_group`` over every rank makes a second communicator: rank 1 all-reducing on it
    first while the others start with the world's deadlocks a real run; the dry run says so."""
    again = "again = dist.new_group(list(range(dist.get_world_size())))"
    world_first = "dist.all_reduce(loss.detach())\ndist.all_reduce(loss.detach(), group=again)"
    again_first = "dist.all_reduce(loss.detach(), group=again)\ndist.all_reduce(loss.detach())"
    script = write_script(
        tmp_path, "twins.py", before=again, inside=_branch("dist.get_rank() == 1", again_first, world_first)
    )
    assert main(["--world", "4", str(script)]) == 1
    out, err = capsys.readouterr()
    assert "the ranks would deadlock" in err and "(ranks 0..3)" in err, err
    assert "warning collective-order-deadlock:" in out


def test_the_same_order_on_every_rank_passes(tmp_path, capsys):
    script = write_script(tmp_path, "same.py", before=ROWS, inside=WORLD_FIRST)
    assert main(["--world", "4", str(script)]) == 0
    out = capsys.readouterr().out
    assert "collective-order-deadlock" not in out
    assert "and their order across 3 groups cannot deadlock among them" in out
    assert "--ranks all runs and compares all 4" in out


# A 2x4 mesh, rows 0..3 and 4..7, columns (0, 4), (1, 5)...: ranks 1 and 4 issue their column's
# all-reduce first, so 0 -> 1 -> 5 -> 4 -> 0 wait in a cycle. Rank 0's default comparison ranks
# are 1, 3, 4 and 7: without rank 5 the cycle cannot be seen.
CROSS_SCRIPT = """\
grid = init_device_mesh('cpu', (2, 4))
row, column = grid.get_group(1), grid.get_group(0)
first, then = (column, row) if dist.get_rank() in (1, 4) else (row, column)
"""


def test_a_cycle_through_a_rank_not_run_needs_ranks_all(tmp_path, capsys):
    inside = "dist.all_reduce(loss.detach(), group=first)\ndist.all_reduce(loss.detach(), group=then)"
    script = write_script(tmp_path, "cross.py", before=CROSS_SCRIPT, inside=inside)
    assert main(["--world", "8", "--steps", "1", str(script)]) == 0
    out = capsys.readouterr().out
    assert "collectives: ranks 0, 1, 3, 4, 7 issue the same collectives" in out
    assert "a cycle of waits through ranks not run cannot be ruled out" in out
    assert main(["--world", "8", "--steps", "1", "--ranks", "all", str(script)]) == 1
    out, err = capsys.readouterr()
    assert "warning collective-order-deadlock:" in out
    assert "rank 0 waits in all-reduce of float32" in err
    assert "for rank 1; rank 1 waits" in err and "for rank 5; rank 5 waits" in err and "for rank 4; rank 4 waits" in err


def test_ignore_cannot_leave_the_deadlock_out(tmp_path):
    with pytest.raises(SystemExit):
        main(["--world", "4", "--ignore", "collective-order-deadlock", str(write_script(tmp_path, "t.py"))])
