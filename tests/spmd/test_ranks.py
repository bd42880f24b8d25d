"""One formatter for lists of ranks (`spmd._util.ranks`): errors, the inspector's table and its
``--ranks worst`` sets."""

from spmd._util.ranks import rank_ranges, ranks_text


def test_runs_and_strides():
    assert rank_ranges(range(6)) == "0..5" and rank_ranges([5]) == "5" and rank_ranges([]) == ""
    assert rank_ranges([1, 3, 5, 7]) == "1..7 step 2" and rank_ranges([0, 2]) == "0,2"
    assert rank_ranges([0, 1, 4, 5]) == "0..1,4..5" and rank_ranges([1, 3, 5], strided=False) == "1,3,5"
    assert rank_ranges([0, 2, 4, 6, 8, 11, 13, 15, 17, 19], most=3) == "0,2,4,... (10 ranks)"


def test_prose():
    assert ranks_text([3]) == "rank 3" and ranks_text([0, 1, 2]) == "ranks 0-2"
    assert ranks_text([0, 2, 5, 6, 7]) == "ranks 0, 2, 5-7" and ranks_text([1, 3, 5]) == "ranks 1, 3, 5"
