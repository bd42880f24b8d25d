"""PNG plots of a plan (per-device memory against HBM) and of an advice (each compiled plan's
memory and estimated throughput, one horizontal bar per plan). Needs matplotlib (the ``plan`` or
``bench`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from spmd._util.atomic_file import atomic_write
from spmd.plan.report.plan_report import GIB, PlanReport

if TYPE_CHECKING:  # the advisor renders its advice here; the report stage sits below it
    from spmd.plan.advisor.advice import Advice

__all__ = ["plot_advice", "plot_report"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: str | Path) -> None:
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def plot_report(report: PlanReport, path: str | Path) -> None:
    """One stacked bar of per-device memory (arguments, outputs not aliased, temporaries) against HBM."""
    plt = _pyplot()
    m = report.memory
    parts = [
        ("arguments", m.argument_bytes),
        ("outputs - aliased", m.output_bytes),
        ("temporaries", m.temp_bytes),
    ]
    fig, ax = plt.subplots(figsize=(5, 4))
    bottom = 0.0
    for label, value in parts:
        ax.bar([0], [value / GIB], bottom=[bottom], label=label)
        bottom += value / GIB
    ax.axhline(m.hbm_bytes / GIB, color="red", linestyle="--", label=f"HBM {m.hbm_bytes / GIB:.1f} GiB")
    ax.set_xticks([0], [f"{report.strategy} {report.mesh}"])
    ax.set_ylabel("GiB per device")
    ax.set_title(f"{report.model} on {report.topology}: {'fits' if report.fits else 'OOM'}")
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def plot_advice(advice: Advice, path: str | Path) -> None:
    """Per compiled plan, one row labelled ``fsdp=16 × tensor=2 · batch 4 · remat dots``: GiB per
    device against the budget (green fits, red OOM), and predicted tokens/s per device for the
    plans that fit only; the winner's row is marked."""
    plt = _pyplot()
    compiled = [o for o in advice.outcomes if o.report is not None]
    labels = [o.candidate.label() for o in compiled]
    rows = list(range(len(compiled)))
    height = max(2.5, 0.45 * len(compiled) + 1.2)
    fig, (mem, rate) = plt.subplots(1, 2, figsize=(12, height), sharey=True, gridspec_kw={"width_ratios": [1, 1]})
    gib = [o.report.memory.total_bytes / GIB for o in compiled]  # type: ignore[union-attr]
    mem.barh(rows, gib, color=["tab:green" if o.fits else "tab:red" for o in compiled])
    mem.axvline(advice.hbm_bytes / GIB, color="black", linestyle="--", label=f"budget {advice.hbm_bytes / GIB:.1f} GiB")
    mem.set_xlabel("GiB per device (red: does not fit)")
    mem.set_yticks(rows, labels, fontsize=8)
    mem.invert_yaxis()  # the ranking's first row on top
    mem.legend(fontsize=8, loc="lower right")
    speeds = [o.report.tokens_per_second / o.report.devices if o.fits else 0.0 for o in compiled]  # type: ignore[union-attr]
    winner = advice.winner
    colors = ["tab:orange" if winner is not None and o is winner else "tab:blue" for o in compiled]
    rate.barh(rows, speeds, color=colors)
    for row, o in zip(rows, compiled):
        if not o.fits:
            rate.text(0, row, "  does not fit", va="center", fontsize=8, color="tab:red")
        elif o is winner:
            rate.text(speeds[row], row, "  winner", va="center", fontsize=8, fontweight="bold")
    rate.set_xlim(0, 1.2 * max(speeds + [1.0]))  # room for the winner's mark
    rate.set_xlabel("predicted tokens/s per device")
    fig.suptitle(f"{advice.model} on {advice.topology}, seq {advice.seq_len}, attention {advice.attention}")
    _save(plt, fig, path)
