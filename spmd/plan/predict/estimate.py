"""The planner's step-time estimate: a prediction from the compiled program
(`spmd.plan.predict._step_time`: each operation's roofline, the collectives on their links, what the
schedule overlaps, loops times their trip counts), and beside it, as its bound, a roofline from
model FLOPs, recomputation and the collectives the compiler emitted.

The bound:
Compute: the step's model FLOPs (`spmd.mfu.flops`: every matmul, causal attention halved, x3 for
backward) per device over the device's peak bf16 FLOP/s, times the remat policy's recomputation
(`spmd.plan.request.remat.recompute_factor`). Communication: each collective's ring bytes sent per device
over the device's share of its chip's all-reduce bandwidth (DCN's for collectives between slices).
The step takes at least the larger of the two (all communication hidden behind compute) and at
most their sum (none hidden); MFU, against the device's bf16 peak, is given for both. The
prediction's MFU counts the same model FLOPs (MaxText's convention: causal attention halved), so it
compares with published runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from spmd.plan.request.remat import Remat, recompute_factor
from spmd.plan.request.topology import TpuSlice

__all__ = ["TOP_OPS", "StepEstimate", "estimate_step", "explain_flops", "model_flops"]

TOP_OPS = 40  # operations listed in `StepEstimate.flops_by_op`


@dataclass(frozen=True)
class StepEstimate:
    """The step-time model of the module docstring (seconds; MFU as a fraction).

    ``hardware_flops_per_device`` (the matmul FLOPs the prediction counts) is explained by
    ``flops_by_loop``, one entry per nest of ``while`` loops (``loops``: ``[[name, trips], ...]``,
    outermost first; ``[]``: the step's own body), and ``flops_by_op``, the `TOP_OPS` largest
    operations (`spmd.plan.predict._step_time.FlopsEntry` as a dict), each with ``flops``, its share of
    the model's FLOPs per device (``of_model``).
    """

    model_flops_per_step: float
    compute_seconds: float
    ici_seconds: float
    dcn_seconds: float
    step_seconds_overlapped: float
    step_seconds_serial: float
    mfu_overlapped: float
    mfu_serial: float
    recompute_factor: float = 1.0
    predicted_seconds: float = 0.0
    predicted_mfu: float = 0.0
    predicted_op_seconds: float = 0.0
    predicted_exposed_seconds: float = 0.0
    predicted_cross_slice_seconds: float = 0.0
    hardware_flops_per_device: float = 0.0
    flops_by_loop: tuple[dict[str, Any], ...] = ()
    flops_by_op: tuple[dict[str, Any], ...] = ()

    @property
    def predicted(self) -> bool:
        """A prediction was made (a compiled program; an out-of-memory plan has none)."""
        return self.predicted_seconds > 0


def model_flops(hf_config: Any, n_params: int, seq_len: int) -> tuple[float, dict[str, float]]:
    """``(training FLOPs per token, the shares of them that remat policies may run again)``:
    attention's, the MLP input projections' and the output projection's (the shares
    `spmd.plan.request.remat.recompute_factor` takes). A model with no known shape counts ``6 N`` and no
    shares."""
    from spmd.mfu.flops import (
        TransformerShape,
        forward_matmul_flops_per_token,
        matmul_flops_per_token,
        six_n_flops_per_token,
    )

    try:
        shape = TransformerShape.from_hf_config(hf_config, n_params)
    except (ValueError, AttributeError):
        return six_n_flops_per_token(n_params), {}
    per_token = matmul_flops_per_token(shape, seq_len)
    layers = 3.0 * shape.n_layer  # training FLOPs: forward and backward, 3 x the forward
    attention = 3.0 * forward_matmul_flops_per_token(shape, seq_len)["attention"]  # causal, windows kept
    # backward of the MLP's output matrix needs its input, so a policy that keeps no MLP output
    # runs the input projections again (two with a gate, one without), not the output one
    mlp_inputs = layers * 2 * shape.d_model * shape.d_ff * (2 if shape.gated_mlp else 1)
    out_projection = layers * 2 * shape.n_head * shape.head_dim * shape.d_model
    return per_token, {
        "attention_share": attention / per_token,
        "mlp_share": mlp_inputs / per_token,
        "out_share": out_projection / per_token,
    }


def estimate_step(
    target: TpuSlice,
    hf_config: Any,
    n_params: int,
    tokens: int,
    seq_len: int,
    remat: Remat,
    collectives: Sequence[Any],
    step_time: Any = None,
) -> StepEstimate:
    """The estimate for a step of ``tokens`` tokens (module docstring); ``collectives`` are
    `spmd.plan.compile.program.StepCollective` values, ``step_time`` the program's
    `spmd.plan.predict._step_time.StepTime` (``None``: no program, no prediction)."""
    per_token, shares = model_flops(hf_config, n_params, seq_len)
    flops = per_token * tokens
    chip, devices = target.chip, target.devices
    factor = recompute_factor(remat, **shares)
    compute = flops / devices / chip.device_peak_flops * factor
    ici = sum(c.bytes_sent_per_device for c in collectives if not c.over_dcn) / chip.device_allreduce_bytes_per_second
    dcn = sum(c.bytes_sent_per_device for c in collectives if c.over_dcn) / chip.device_dcn_bytes_per_second
    overlapped, serial = max(compute, ici + dcn), compute + ici + dcn

    def mfu(seconds: float) -> float:
        return flops / (seconds * devices * chip.device_peak_flops) if seconds > 0 else 0.0

    bound = StepEstimate(flops, compute, ici, dcn, overlapped, serial, mfu(overlapped), mfu(serial), factor)
    if step_time is None or step_time.seconds <= 0:
        return bound
    return replace(
        bound,
        predicted_seconds=step_time.seconds,
        predicted_mfu=mfu(step_time.seconds),
        predicted_op_seconds=step_time.op_seconds,
        predicted_exposed_seconds=step_time.exposed_seconds,
        predicted_cross_slice_seconds=step_time.cross_slice_seconds,
        hardware_flops_per_device=step_time.hardware_flops,
        **explain_flops(step_time.flops_by_op, flops / devices),
    )


def explain_flops(entries: Sequence[Any], model_flops_per_device: float) -> dict[str, tuple[dict[str, Any], ...]]:
    """``flops_by_loop`` and ``flops_by_op`` (`StepEstimate`) of the program's `FlopsEntry` list."""
    share = (lambda f: f / model_flops_per_device) if model_flops_per_device > 0 else (lambda f: 0.0)
    by_loop: dict[tuple[tuple[str, int], ...], list[float]] = {}
    for e in entries:
        acc = by_loop.setdefault(e.loops, [0.0, 0])
        acc[0] += e.flops
        acc[1] += 1
    loops = tuple(
        {"loops": [list(x) for x in k], "ops": n, "flops": f, "of_model": share(f)}
        for k, (f, n) in sorted(by_loop.items(), key=lambda kv: -kv[1][0])
    )
    ops = tuple(
        {
            "op": e.op, "opcode": e.opcode, "shape": e.shape, "loops": [list(x) for x in e.loops],
            "flops_per_run": e.flops_per_run, "runs": e.runs, "flops": e.flops, "of_model": share(e.flops),
        }
        for e in list(entries)[:TOP_OPS]
    )  # fmt: skip
    return {"flops_by_loop": loops, "flops_by_op": ops}
