"""The advisor's values: a `Candidate` plan, its `Outcome`, and the `Advice` (ranking, the
winner as code and as a Trainer ``fsdp_config.json``, and the published figure beside it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from spmd.plan.published import published_for
from spmd.plan.remat import Remat
from spmd.plan.report import PlanReport

__all__ = ["Advice", "Candidate", "Outcome"]


@dataclass(frozen=True)
class Candidate:
    """One plan to try: strategy, mesh axis sizes, sequences per batch shard, remat policy."""

    strategy: str
    mesh: tuple[tuple[str, int], ...]
    per_device_batch: int
    remat: str = Remat.DOTS.value

    @property
    def mesh_shape(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def global_batch(self) -> int:
        """Per-device batch times the batch shards (every axis but ``tensor``)."""
        return self.per_device_batch * math.prod(s for a, s in self.mesh if a != "tensor")

    def label(self) -> str:
        """One line: ``fsdp=16 × tensor=2 · batch 4 · remat full``."""
        mesh = " × ".join(f"{a}={s}" for a, s in self.mesh)
        return f"{mesh} · batch {self.per_device_batch} · remat {self.remat}"


@dataclass(frozen=True)
class Outcome:
    """A candidate and its compiled report, or why it was not compiled."""

    candidate: Candidate
    report: PlanReport | None = None
    skipped: str = ""
    cached: bool = False

    @property
    def fits(self) -> bool:
        return self.report is not None and self.report.fits


@dataclass(frozen=True)
class Advice:
    """The advisor's result: every candidate's outcome, fitting ones first, best first (``interrupted``:
    the search was stopped by Ctrl-C, and these are the plans done by then)."""

    model: str
    topology: str
    chip: str
    chips: int
    slices: int
    seq_len: int
    compute_dtype: str
    attention: str
    hbm_bytes: int
    outcomes: tuple[Outcome, ...]
    block_class: str | None = None
    model_type: str | None = None
    notes: tuple[str, ...] = field(default=())
    interrupted: bool = False  # Ctrl-C stopped the search: the outcomes are a part of it

    @property
    def winner(self) -> Outcome | None:
        return self.outcomes[0] if self.outcomes and self.outcomes[0].fits else None

    def largest_batches(self) -> list[Outcome]:
        """For each (strategy, mesh, remat) that fits at all: its largest fitting batch, best first."""
        best: dict[tuple[Any, ...], Outcome] = {}
        for o in self.outcomes:
            c = o.candidate
            key = (c.strategy, c.mesh, c.remat)
            if o.fits and (key not in best or c.per_device_batch > best[key].candidate.per_device_batch):
                best[key] = o
        return sorted(best.values(), key=lambda o: -o.report.tokens_per_second)  # type: ignore[union-attr]

    def published(self) -> str | None:
        """The published run of this model on this many chips, if any (`spmd.plan.published`)."""
        found = published_for(self.model, self.chip, self.chips)
        return None if found is None else found.line()

    def table(self) -> str:
        from spmd.plan.advice_text import advice_table

        return advice_table(self)

    def code(self) -> str:
        """The winner as a training-script fragment for `fsdp_xla` / `spmd`."""
        from spmd.plan.advice_text import winner_code

        return winner_code(self)

    def fsdp_config(self) -> dict[str, Any] | None:
        """The winner as a Trainer ``fsdp_config`` (``None`` for data parallel, which is not FSDP)."""
        w = self.winner
        if w is None or w.candidate.strategy == "dp":
            return None
        config: dict[str, Any] = {"xla": True, "xla_fsdp_v2": True}
        if self.block_class:
            config["transformer_layer_cls_to_wrap"] = [self.block_class.rpartition(".")[2]]
        config["xla_fsdp_grad_ckpt"] = Remat(w.candidate.remat).checkpoints_block
        if self.compute_dtype == "bfloat16":
            config["xla_fsdp_settings"] = {"compute_dtype": "bfloat16"}
        return config

    def to_dict(self) -> dict[str, Any]:
        head = {k: getattr(self, k) for k in ("model", "topology", "chip", "chips", "slices", "seq_len")}
        head.update(compute_dtype=self.compute_dtype, attention=self.attention, hbm_bytes=self.hbm_bytes)
        return {
            **head,
            "winner": None
            if self.winner is None
            else f"{self.winner.candidate.strategy} {self.winner.candidate.label()}",
            "published": self.published(),
            "code": self.code(),
            "fsdp_config": self.fsdp_config(),
            "outcomes": [_outcome_dict(o) for o in self.outcomes],
        }


def _outcome_dict(o: Outcome) -> dict[str, Any]:
    c = o.candidate
    return {
        "strategy": c.strategy,
        "mesh": c.mesh_shape,
        "per_device_batch": c.per_device_batch,
        "global_batch": c.global_batch,
        "remat": c.remat,
        "skipped": o.skipped,
        "cached": o.cached,
        "report": None if o.report is None else o.report.to_dict(),
    }
