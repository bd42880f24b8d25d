"""Warnings the inspector raises, as `Finding` values, for both backends.

torch_xla's compiled steps (`find_issues`): what is replicated that need not be, what is
gathered whole every step, and what was compiled more than once. A dry run's rank
(`dry_run_issues`): parameters split unevenly and what the padding costs, and the script's lines
that read a tensor's value the dry run does not have."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mesh.checks import is_int, is_real
from spmd.inspector.collectives import CollectiveKind
from spmd.inspector.report import Finding, GraphReport, WarningCode, format_bytes

if TYPE_CHECKING:
    from spmd.inspector._dtensor.run import RankRun

__all__ = ["CheckOptions", "find_issues", "dry_run_issues", "IMPLICIT_GRAPH"]

IMPLICIT_GRAPH = "SyncTensorsGraph"
"""The name torch_xla gives a graph nobody named."""


@dataclass(frozen=True)
class CheckOptions:
    """Thresholds of the checks.

    Attributes:
        replicated_threshold_bytes: warn about replicated tensors of at least this many bytes
            (whole tensor).
        warmup_steps: steps that may compile (the first step, and the second, when the
            optimizer creates its state in the first).
        ignore: warning codes not to report (values of `WarningCode`, e.g.
            ``"parameter-all-gather"`` when FSDP gathers weights on purpose).
    """

    replicated_threshold_bytes: int = 1 << 20
    warmup_steps: int = 2
    ignore: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        _check_number(self.replicated_threshold_bytes, "replicated_threshold_bytes", numbers.Real)
        if self.replicated_threshold_bytes == math.inf:
            raise ValueError("replicated_threshold_bytes is inf; to drop these warnings, ignore 'replicated-argument'.")
        _check_number(self.warmup_steps, "warmup_steps", numbers.Integral)
        object.__setattr__(self, "ignore", _ignore_codes(self.ignore))


def _check_number(value: object, name: str, kind: type) -> None:
    """``value`` is a ``kind`` number (not a bool) >= 0 (nan refused: it would silence a check)."""
    what = "a whole number" if kind is numbers.Integral else "a number"
    if not (is_int(value) if kind is numbers.Integral else is_real(value)):
        raise TypeError(f"{name} must be {what} >= 0, got {type(value).__name__} {value!r:.60}.")
    if not value >= 0:  # type: ignore[operator]
        raise ValueError(f"{name} must be {what} >= 0, got {value!r}.")


def _ignore_codes(ignore: object) -> frozenset[str]:
    """``ignore`` as a frozenset of known warning codes; one code may be given as a string."""
    known = {c.value for c in WarningCode}
    if isinstance(ignore, (str, WarningCode)):
        ignore = (ignore,)
    try:
        codes = [c.value if isinstance(c, WarningCode) else c for c in ignore]  # type: ignore[union-attr]
    except TypeError:
        raise TypeError(
            f"ignore must be a list of warning codes, got {ignore!r:.60}; known codes: {sorted(known)}."
        ) from None
    unknown = [c for c in codes if not isinstance(c, str) or c not in known]
    if unknown:
        raise ValueError(
            f"Unknown warning code(s) {unknown!r:.200} in ignore (a list of codes, or one code); "
            f"known codes: {sorted(known)}."
        )
    return frozenset(codes)


def _replicated(sharding: str) -> bool:
    return sharding.strip() == "{replicated}"


def _graph_issues(g: GraphReport, opts: CheckOptions) -> Iterable[Finding]:
    n = g.num_partitions
    if n <= 1:
        return
    threshold = opts.replicated_threshold_bytes
    for p in g.parameters:
        if _replicated(p.sharding) and p.global_nbytes >= threshold:
            yield Finding(
                WarningCode.REPLICATED_ARGUMENT,
                g.name,
                f"{p.label} {p.global_shape or p.shape} ({format_bytes(p.global_nbytes)}) is replicated: each of "
                f"the {n} devices holds all of it. Shard it with mark_sharding(t, mesh, P(...)) on a dim a "
                f"mesh axis divides; split {n} ways it would take {format_bytes(p.global_nbytes // n)} per device "
                f"instead of {format_bytes(p.global_nbytes)}.",
            )
    for c in g.collectives:
        full_group = c.group_size == n
        if c.source_parameter is not None and c.kind is CollectiveKind.ALL_GATHER:
            p = g.parameter(c.source_parameter)
            if p is not None and c.result_bytes >= p.global_nbytes >= threshold:
                yield Finding(
                    WarningCode.PARAMETER_ALL_GATHER,
                    g.name,
                    f"{p.label} {p.global_shape or p.shape} is stored sharded ({p.sharding}) but all-gathered "
                    f"whole every step ({format_bytes(c.bytes_sent_per_device)} sent per device, by "
                    f"{c.op_type or 'an op'} at {c.source or c.op_name or 'unknown source'}). If this is not FSDP "
                    "on purpose, shard the activation it meets along the same mesh axis (on the contracting "
                    "dim, so GSPMD reduces partial results instead) or keep the weight replicated.",
                )
                continue
        if (
            full_group
            and c.source_parameter is None
            and c.kind in (CollectiveKind.ALL_GATHER, CollectiveKind.ALL_REDUCE)
            and c.result_bytes >= threshold
        ):
            yield Finding(
                WarningCode.REPLICATED_ACTIVATION,
                g.name,
                f"a {c.shape} value ({format_bytes(c.result_bytes)}) from {c.op_type or 'an op'} at "
                f"{c.source or c.op_name or 'unknown source'} goes through an {c.kind.value} over all {n} "
                "devices, so each holds it whole. Constrain it to stay sharded, e.g. with_sharding_constraint(y, mesh, "
                "P('data', ...)), or shard the inputs of the op that makes it.",
            )


def find_issues(
    graphs: Sequence[GraphReport],
    steps: Mapping[int, Sequence[int]],
    options: CheckOptions | None = None,
) -> tuple[Finding, ...]:
    """Every warning about ``graphs`` (compiled in ``steps``: module ids per step), minus the
    ignored codes."""
    opts = options or CheckOptions()
    found: list[Finding] = []
    for g in graphs:
        found.extend(_graph_issues(g, opts))
    name_of = {g.module_id: g.name for g in graphs}
    for step, ids in sorted(steps.items()):
        names = [name_of.get(i, f"module {i}") for i in ids]
        if step >= opts.warmup_steps and names:
            found.append(
                Finding(
                    WarningCode.RECOMPILATION,
                    ", ".join(names),
                    f"step {step} compiled {len(names)} graph(s) after {opts.warmup_steps} warm-up step(s): the "
                    "traced program changed between steps (a Python scalar baked in as a constant, a new input "
                    "shape, a changed sharding). Each compile can take minutes on a TPU pod.",
                )
            )
        elif len(implicit := [n for n in names if n.startswith(IMPLICIT_GRAPH)]) > 1:
            # Graphs given a name (torch_xla.compile(name=...), fsdp_xla's forward+backward graph)
            # are cut on purpose; torch_xla names the graphs it cuts by itself SyncTensorsGraph.
            found.append(
                Finding(
                    WarningCode.RECOMPILATION,
                    ", ".join(implicit),
                    f"step {step} compiled {len(implicit)} graphs: something forced execution mid-step "
                    "(tensor.item(), printing a tensor, a data-dependent shape, an extra torch_xla.sync()). "
                    "One graph per step is cheapest: each graph is another compile and device round trip.",
                )
            )
    return _kept(found, opts.ignore)


def _kept(found: Iterable[Finding], ignore: frozenset[str]) -> tuple[Finding, ...]:
    """``found`` without the ignored codes."""
    return tuple(f for f in found if f.code.value not in ignore)


def _uneven_shards(run: RankRun) -> Iterable[Finding]:
    summary = run.parameters
    if summary is None or not summary.padded:
        return
    pad = format_bytes(sum(p.padding_bytes for p in summary.padded))
    first = summary.padded[0]
    split = f"{len(summary.padded)} parameter(s) split unevenly, e.g. {first.name} {list(first.shape)} dim {first.dim} "
    if run.fsdp:
        cost = (
            f"over {first.ranks} ranks: FSDP pads them, so their gathered buffers hold {pad} of padding, gathered "
            "(and sent) every time the weights are. Fewer ranks on the FSDP axis, or dims that divide by it, remove it."
        )
    else:
        cost = (
            f"over {first.ranks} ranks: the last ranks hold fewer rows (or none), so the ranks' memory differs (--ranks "
            f"worst runs one of each), and DTensor pads the shards to gather them ({pad} over all ranks). Dims that "
            "divide by the ranks sharding them remove it."
        )
    yield Finding(WarningCode.UNEVEN_SHARD, "", split + cost)


def dry_run_issues(run: RankRun, ignore: frozenset[str] = frozenset()) -> tuple[Finding, ...]:
    """Every warning about a dry run's rank ``run`` (the one with the highest peak), minus the
    ``ignore``-d codes: uneven (padded) shards with their cost, the placeholders the script
    read, and where it called ``torch.compile`` (run eagerly)."""
    found = list(_uneven_shards(run))
    for line, calls in sorted(run.placeholders.items()):
        found.append(
            Finding(
                WarningCode.DATA_DEPENDENT,
                "",
                f"{line} read a tensor's value {calls} time(s) (.item(), bool(), tolist(), printing): the "
                "dry run has no values and gave a placeholder (0, False; printed: the fake tensor); what the script "
                "did with it is not real.",
            )
        )
    for line, calls in sorted(run.compiled.items()):
        found.append(
            Finding(
                WarningCode.COMPILED_EAGERLY,
                "",
                f"{line} calls torch.compile ({calls} time(s)): the dry run ran it eagerly (its memory tracker follows "
                "modules, not compiled graphs), so the memory shown is eager mode's; compiled code can fuse ops and "
                "hold fewer activations. The collectives are the program's either way.",
            )
        )
    return _kept(found, ignore)
