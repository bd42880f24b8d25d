"""PNG plots of a plan (per-chip memory against HBM) and of an advice (each candidate's memory
and estimated throughput). Needs matplotlib (the ``bench`` or ``plan`` extra)."""

from __future__ import annotations

from pathlib import Path

from spmd.atomic_file import atomic_write
from spmd.plan.advisor import Advice
from spmd.plan.report import GIB, PlanReport

__all__ = ["plot_advice", "plot_report"]


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_report(report: PlanReport, path: str | Path) -> None:
    """One stacked bar of per-chip memory (arguments, outputs not aliased, temporaries) against HBM."""
    plt = _pyplot()
    m = report.memory
    parts = [
        ("arguments", m.argument_bytes),
        ("outputs - aliased", m.output_bytes - m.alias_bytes),
        ("temporaries", m.temp_bytes),
    ]
    fig, ax = plt.subplots(figsize=(5, 4))
    bottom = 0.0
    for label, value in parts:
        ax.bar([0], [value / GIB], bottom=[bottom], label=label)
        bottom += value / GIB
    ax.axhline(m.hbm_bytes / GIB, color="red", linestyle="--", label=f"HBM {m.hbm_bytes / GIB:.1f} GiB")
    ax.set_xticks([0], [f"{report.strategy} {report.mesh}"])
    ax.set_ylabel("GiB per chip")
    ax.set_title(f"{report.model} on {report.topology}: {'fits' if report.fits else 'OOM'}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def plot_advice(advice: Advice, path: str | Path) -> None:
    """Per compiled candidate: GiB per chip (bars, budget line) and estimated tokens/s per chip."""
    plt = _pyplot()
    compiled = [o for o in advice.outcomes if o.report is not None]
    labels = [o.candidate.label() for o in compiled]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6, len(compiled) * 0.8), 7), sharex=True)
    gib = [o.report.memory.total_bytes / GIB for o in compiled]  # type: ignore[union-attr]
    top.bar(range(len(compiled)), gib, color=["tab:green" if o.fits else "tab:red" for o in compiled])
    top.axhline(advice.hbm_bytes / GIB, color="black", linestyle="--", label="budget")
    top.set_ylabel("GiB per chip")
    top.legend(fontsize=8)
    rate = [o.report.tokens_per_second / o.report.chips for o in compiled]  # type: ignore[union-attr]
    bottom.bar(range(len(compiled)), rate, color=["tab:green" if o.fits else "tab:gray" for o in compiled])
    bottom.set_ylabel("est. tokens/s per chip")
    bottom.set_xticks(range(len(compiled)), labels, rotation=60, ha="right", fontsize=7)
    top.set_title(f"{advice.model} on {advice.topology}")
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
