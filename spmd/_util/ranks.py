"""Ranks as short text: ``0..63``, ``1..7 step 2``, ``0..1,4..5`` (and, in prose, ``ranks 0-2, 5``).

One formatter for every list of ranks the project prints: an error naming the ranks that
disagree, a collective's group in the inspector's table, the sets of ranks ``--ranks worst``
found. Runs of consecutive ranks shorten to their ends; a whole list evenly spaced (a group
along one axis of a mesh) to its ends and step.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["rank_ranges", "ranks_text"]


def _runs(ranks: Sequence[int], strided: bool) -> list[tuple[int, int, int]]:
    """``(first, last, step)`` runs: consecutive ranks together; the whole list as one run when
    it is evenly spaced (at least 3 ranks) and ``strided``."""
    steps = {b - a for a, b in zip(ranks, ranks[1:])}
    if strided and len(ranks) > 2 and len(steps) == 1 and (step := steps.pop()) > 1:
        return [(ranks[0], ranks[-1], step)]
    runs: list[tuple[int, int, int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r, 1)
        else:
            runs.append((r, r, 1))
    return runs


def rank_ranges(
    ranks: Sequence[int], *, to: str = "..", sep: str = ",", strided: bool = True, most: int | None = None
) -> str:
    """``ranks`` as runs: ``[0, 1, 2, 3]`` -> ``'0..3'``, ``[1, 3, 5, 7]`` -> ``'1..7 step 2'``,
    ``[0, 1, 4, 5]`` -> ``'0..1,4..5'``.

    Args:
        ranks: the ranks, in the order to show.
        to: what joins a run's ends (``'-'`` in prose).
        sep: what joins the runs.
        strided: an evenly spaced list as one run with its step.
        most: show at most this many runs, then ``,... (N ranks)``.
    """
    texts = [
        str(a) if a == b else f"{a}{to}{b}" + (f" step {step}" if step > 1 else "")
        for a, b, step in _runs(list(ranks), strided)
    ]
    if most is not None and len(texts) > most:
        return sep.join(texts[:most]) + f"{sep}... ({len(ranks)} ranks)"
    return sep.join(texts)


def ranks_text(ranks: Sequence[int]) -> str:
    """In prose: ``rank 3``, ``ranks 0-2``, ``ranks 0, 2, 5-7``."""
    words = rank_ranges(ranks, to="-", sep=", ", strided=False)
    return f"rank {words}" if len(ranks) == 1 else f"ranks {words}"
