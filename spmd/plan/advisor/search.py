"""One mesh's search of the advisor: for each remat policy, the largest per-device batch that
fits, found with as few compiles as our memory math allows (pure Python: no compile here).

Policies run least recomputation first. A policy is only worth a batch larger than every lighter
policy's largest fitting one (at a batch a lighter policy fits, it would only be slower), as
MaxText's ``estimator.py`` walks its Pareto frontier of batch against policy. Within a policy:

1. batches our math (`spmd.plan.predict.memory`) puts more than `MARGIN` over the budget are ruled out
   unseen, and so is the policy when none is left (one line says why, with the figure);
2. the rest are bisected by compiling, as MaxText's ``largest_batch_size`` does, first probing
   the largest batch our math says fits: when the math is right, one compile settles the policy,
   and a second, the next batch up, confirms that it was the largest.

A model of no known shape has no math: every batch is a candidate and the first probe is the
smallest.

Across meshes, a policy that cannot win is not compiled: every mesh's search shares a `Leader`,
the best predicted MFU of a compiled plan that fits so far, and a policy whose MFU ceiling
(`spmd.plan.predict.ceiling`, known before compiling) is below it ends the search, with every heavier
policy (their ceilings are no higher). A search rules out nothing so until a plan of its own mesh
has been compiled and every one compiled so far counts at least its floor of matmul FLOPs (where
the step-time model misses matmuls, a prediction can pass the ceiling). The winner is then the
same as with every plan of the search compiled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from spmd.plan.advisor.advice import Candidate, Outcome
from spmd.plan.predict.memory import MARGIN, MemoryMath

__all__ = ["MeshSearch"]

Predict = Callable[[str, int], "MemoryMath | None"]
Ceiling = Callable[[str], "float | None"]
Counted = Callable[[Outcome], bool]


def _no_ceiling(remat: str) -> float | None:
    return None


def _counted(outcome: Outcome) -> bool:
    return True


@dataclass
class Leader:
    """The best predicted MFU of a compiled plan that fits, shared by every mesh's search."""

    mfu: float = 0.0
    label: str = ""

    def offer(self, outcome: Outcome) -> None:
        if outcome.fits and outcome.report.mfu > self.mfu:  # type: ignore[union-attr]
            c = outcome.candidate
            self.mfu, self.label = outcome.report.mfu, f"{c.strategy} {c.label()}"  # type: ignore[union-attr]

    def beats(self, ceiling: float | None) -> bool:
        """A plan already compiled beats every plan of this ceiling (``None``: no ceiling known)."""
        return ceiling is not None and ceiling < self.mfu

    def why_not(self, ceiling: float) -> str:
        """Why a policy of ``ceiling``, which `beats` says cannot win, is not compiled."""
        return (
            f"not compiled: cannot win: its predicted MFU is at most {100 * ceiling:.1f} % (spmd.plan.predict.ceiling), "
            f"below the {100 * self.mfu:.1f} % of {self.label}"
        )


@dataclass
class _Policy:
    """The bisection of one policy's batches: ``lo..hi`` are indices into ``batches`` not yet
    settled; ``found`` the largest known to fit."""

    remat: str
    batches: list[int]
    lo: int = 0
    hi: int = -1
    found: int | None = None
    guess: int = 0


@dataclass
class MeshSearch:
    """The search of one (strategy, mesh) (module docstring). Call `next` for the candidate to
    compile, `record` its outcome; `outcomes` holds every result and every ruled-out policy."""

    strategy: str
    mesh: tuple[tuple[str, int], ...]
    batches: tuple[int, ...]
    remats: tuple[str, ...]
    budget: int
    predict: Predict
    ceiling: Ceiling = _no_ceiling
    leader: Leader = field(default_factory=Leader)
    counted: Counted = _counted  # a compiled plan's matmul count reaches its floor (`spmd.plan.predict.ceiling`)
    outcomes: list[Outcome] = field(default_factory=list)
    _index: int = -1
    _best: int = 0
    _policy: _Policy | None = None
    _waiting: Candidate | None = None
    _floor_holds: bool | None = None  # None: no plan of this mesh compiled with a prediction yet

    def candidate(self, remat: str, batch: int) -> Candidate:
        return Candidate(self.strategy, self.mesh, batch, remat)

    def next(self) -> Candidate | None:
        """The next candidate to compile, or ``None`` when the search is over."""
        if self._waiting is not None:
            raise RuntimeError("MeshSearch.next: the previous candidate's outcome was not recorded")
        while True:
            p = self._policy
            if p is not None and p.lo <= p.hi and self._beaten(p.remat):
                return None
            if p is not None and p.lo <= p.hi:
                probe = min(max(p.guess, p.lo), p.hi)
                self._waiting = self.candidate(p.remat, p.batches[probe])
                return self._waiting
            if p is not None and p.found is not None:
                self._best = max(self._best, p.found)
            if not self._start_next_policy():
                return None

    def record(self, outcome: Outcome) -> None:
        """The outcome of the candidate `next` gave."""
        p, c = self._policy, self._waiting
        if p is None or c is None or outcome.candidate != c:
            raise RuntimeError(f"MeshSearch.record: {outcome.candidate} is not the candidate waiting ({c})")
        self._waiting = None
        self.outcomes.append(outcome)
        self.leader.offer(outcome)
        if outcome.fits:  # a plan that fits has a prediction: does its count reach its floor?
            self._floor_holds = self._floor_holds is not False and self.counted(outcome)
        index = p.batches.index(c.per_device_batch)
        if outcome.fits:
            p.found, p.lo = c.per_device_batch, index + 1
            p.guess = index + 1  # the next batch up: is this the largest?
        else:
            p.hi = index - 1
            p.guess = (p.lo + p.hi) // 2

    def left(self) -> tuple[int, int]:
        """``(likely, at most)`` compiles left, for the progress line: the current policy's
        bisection, and for each later policy one compile when our math is right (at most every
        batch it does not rule out)."""
        span = 0 if self._policy is None else max(0, self._policy.hi - self._policy.lo + 1)
        likely, most = math.ceil(math.log2(span + 1)), span
        for remat in self.remats[self._index + 1 :]:
            if self._cannot_win(remat):
                break  # it and every heavier policy cannot win
            worth = len(self._worth(remat))
            likely, most = likely + min(worth, 1), most + worth
        return likely, most

    def _worth(self, remat: str) -> list[int]:
        """The batches of ``remat`` beyond the lighter policies' best that our math does not rule out."""
        larger = [b for b in self.batches if b > self._best]
        limit = self.budget * (1 + MARGIN)
        return [b for b in larger if (m := self.predict(remat, b)) is None or m.total <= limit]

    def _start_next_policy(self) -> bool:
        """Move to the next policy worth compiling; False when none is left."""
        while self._index + 1 < len(self.remats):
            self._index += 1
            remat = self.remats[self._index]
            if self._beaten(remat):
                return False
            larger = [b for b in self.batches if b > self._best]
            if not larger:
                return False  # every batch already fits with less recomputation
            worth = self._worth(remat)
            if not worth:
                self._rule_out(remat, larger[0])
                continue
            fit = [
                i for i, b in enumerate(worth) if (m := self.predict(remat, b)) is not None and m.total <= self.budget
            ]
            self._policy = _Policy(remat, worth, 0, len(worth) - 1, guess=fit[-1] if fit else 0)
            return True
        self._policy = None
        return False

    def withdraw_if_beaten(self) -> bool:
        """Drop the candidate `next` gave, not yet compiled, if a plan found since beats its
        policy (the search then ends); whether it did."""
        c = self._waiting
        if c is None or not self._cannot_win(c.remat):
            return False
        self._waiting = None
        return self._beaten(c.remat)

    def _cannot_win(self, remat: str) -> bool:
        return self._floor_holds is True and self.leader.beats(self.ceiling(remat))

    def _beaten(self, remat: str) -> bool:
        """If a compiled plan beats ``remat``'s ceiling, rule out it and every heavier policy
        (their ceilings are no higher) and end the search."""
        if not self._cannot_win(remat):
            return False
        start = self.remats.index(remat)
        for r in self.remats[start:]:
            why = self.leader.why_not(self.ceiling(r))  # type: ignore[arg-type]
            self.outcomes.append(Outcome(self.candidate(r, self.batches[0]), skipped=why))
        self._index, self._policy = len(self.remats), None
        return True

    def _rule_out(self, remat: str, batch: int) -> None:
        math = self.predict(remat, batch)
        why = (
            f"not compiled: our memory math gives {math.describe() if math else '?'} at batch {batch}, more than "
            f"{1 + MARGIN:.2f} x the budget ({self.budget / 2**30:.2f} GiB)"
        )
        self.outcomes.append(Outcome(self.candidate(remat, batch), skipped=why))
