"""A dry run flags collectives that not every rank of their group issues (a real run hangs
there): it runs other ranks beside the one asked for, compares what each issued, and fails
naming the rank, the collective and the script's line."""

import sys

import pytest

pytest.importorskip("torch.distributed._tools.fsdp2_mem_tracker")

from spmd.inspector._dtensor.agreement import Issued, comparison_ranks, first_mismatch  # noqa: E402
from spmd.inspector.cli import main  # noqa: E402
from tests.spmd.inspector.dry_scripts import line_of, write_script  # noqa: E402

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12), reason="the DTensor lane (torch 2.15)")

WORLD = (0, 1, 2, 3)
GATHER, REDUCE = Issued("all-gather", WORLD, "float32", "t.py:5"), Issued("reduce-scatter", WORLD, "float32", "t.py:6")


def test_the_same_collectives_on_every_rank_agree():
    assert first_mismatch({0: [GATHER, REDUCE] * 2, 3: [GATHER, REDUCE] * 2}) == ""


def test_a_collective_one_rank_adds_is_named_with_its_line():
    extra = Issued("all-reduce", WORLD, "float32", "t.py:9")
    found = first_mismatch({0: [GATHER, extra, REDUCE], 2: [GATHER, REDUCE]})
    assert "rank 0 issues all-reduce of float32 at t.py:9 on the group of ranks 0..3" in found
    assert "which rank 2 does not issue" in found and "if rank == 0" in found


def test_different_collectives_at_the_same_place_are_named():
    found = first_mismatch({0: [GATHER], 1: [REDUCE]})
    assert "collective #0 is all-gather of float32 at t.py:5 on rank 0 but reduce-scatter" in found


def test_the_same_collective_on_two_groups_over_the_same_ranks_is_named():
    """Rank 0 all-reduces on the world (process group 0), rank 1 on a group made over the same
    ranks (process group 2): different communicators, so they never meet."""
    world, twin = (
        Issued("all-reduce", WORLD, "float32", "t.py:5", "0"),
        Issued("all-reduce", WORLD, "float32", "t.py:7", "2"),
    )
    found = first_mismatch({0: [world], 1: [twin]})
    assert "rank 0 issues all-reduce of float32 at t.py:5 on process group 0 (ranks 0..3)" in found
    assert "which rank 1 does not issue" in found
    assert first_mismatch({0: [world, twin], 1: [world, twin]}) == ""


def test_groups_a_rank_is_not_in_are_not_its_to_meet():
    """Tensor parallel groups (0, 1) and (2, 3): rank 0 and rank 2 share no group."""
    assert first_mismatch({0: [Issued("all-reduce", (0, 1), "float32", "")], 2: []}) == ""
    assert first_mismatch({0: [Issued("all-reduce", (0, 1), "float32", "")], 1: []}) != ""


def test_comparison_ranks_cover_each_group_after_and_last():
    assert comparison_ranks(0, 4, [GATHER]) == [1, 3]
    assert comparison_ranks(3, 4, [GATHER]) == [0, 2]
    assert comparison_ranks(
        0, 8, [Issued("all-reduce", (0, 2, 4, 6), "", ""), Issued("all-reduce", (0, 1), "", "")]
    ) == [1, 2, 6]
    assert comparison_ranks(0, 4, []) == [1, 3]  # no collective: the world's


@pytest.mark.parametrize("branch,ranks", [("dist.get_rank() == 0", []), ("dist.get_rank() == 2", ["--ranks", "all"])])
def test_a_collective_only_some_ranks_issue_fails_the_dry_run(tmp_path, capsys, branch, ranks):
    inside = f"if {branch}:\n    dist.all_reduce(loss.detach())"
    script = write_script(tmp_path, "one_rank.py", inside=inside)
    assert main(["--world", "4", *ranks, str(script)]) == 1
    out, err = capsys.readouterr()
    rank = branch[-1]
    assert f"rank {rank} issues all-reduce of float32 at {line_of(script, 'dist.all_reduce(loss.detach())')}" in err
    assert "warning unmatched-collectives:" in out


def test_ranks_that_agree_pass_and_say_which_were_compared(tmp_path, capsys):
    script = write_script(tmp_path, "agree.py", inside="if dist.get_rank() == 0:\n    print('logging only')")
    assert main(["--world", "4", str(script)]) == 0
    out = capsys.readouterr().out
    assert "collectives: ranks 0, 1, 3 issue the same collectives on every group they share" in out
    assert "--ranks all runs and compares all 4" in out


def test_ignore_cannot_leave_the_error_out(tmp_path):
    with pytest.raises(SystemExit):
        main(["--world", "4", "--ignore", "unmatched-collectives", str(write_script(tmp_path, "t.py"))])
