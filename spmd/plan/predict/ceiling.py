"""The highest predicted MFU a plan could reach, known before compiling it: the advisor does not
compile a remat policy whose ceiling is below a plan it already compiled that fits (it cannot
win).

Why it is a ceiling (`spmd.plan.predict._step_time`): the predicted step is at least the operations' own
time, each operation at least its matmul time, and a matmul at least its FLOPs over the peak
times the calibrated efficiency (times a matrix-unit fill of at most 1). So

    predicted MFU <= efficiency x model FLOPs / program matmul FLOPs,

with ``efficiency`` the larger of the calibration's matmul and attention efficiencies on the
plan's chip (`Calibration.efficiencies`). The
program's matmul FLOPs are at least the model's (`spmd.mfu.flops`: every matmul of forward and
backward, causal attention halved; the splash kernel's backward runs more, the dot attention's
the whole square) plus the forward of what the policy cannot keep and backward reads again:

- ``full`` and ``offload`` keep only the block's input: q, k and v, attention's output and the
  MLP's input projections are computed again (backward needs each; the out and down
  projections' outputs only join the residual stream, so they are not);
- ``save_dot_except_mlp`` and ``save_qkv_proj`` keep no MLP output: its input projections again;
- ``save_qkv_context`` keeps attention's output but not the output projection's, which the MLP's
  input needs: the output projection and the MLP's input projections again;
- ``none`` and ``dots`` keep every projection: nothing certain (attention's recomputation under
  them depends on the kernel's residuals, so it is left out: the ceiling stays a ceiling);
- a per-tensor policy (``custom:``) by the same rules, from what it keeps on the device or the
  host: q, k and v again (and attention) unless all three are kept, the MLP's input projections
  unless both are, the output projection when attention's output is kept and it is not.

This is a floor under the recomputation, lower than the roofline's (`recompute_factor`, which
counts the whole forward for ``full``): measured on Llama 3.1-70B with ``full``, the program runs
1.28 x the model's FLOPs, the floor 1.22, the roofline 1.33.

The floor holds only where the step-time model counts every matmul the program runs. It did not
on Llama 3.1-70B's 2-D plans (fsdp 32 x tensor 4: 0.52 x and 0.69 x the model's FLOPs) until
loops were counted from their counter's start by its step (windowed einsums: now 1.06 x and
1.23 x); a matmul it does not see would leave a prediction with no ceiling, so `runs_its_floor`
tells a compiled plan whose count reaches its floor, and the advisor rules a mesh's policies out
only once that mesh's compiled plans all do.
"""

from __future__ import annotations

from typing import Any

from spmd.mfu.flops import forward_matmul_flops_per_token
from spmd.plan.predict._calibration import CALIBRATION, Calibration
from spmd.plan.request.custom_remat import CONTEXT_NAME, MLP_INPUTS, OUT_PROJ, QKV, CustomRemat
from spmd.plan.request.remat import Remat, as_custom

__all__ = ["mfu_ceiling", "recompute_floor", "runs_its_floor"]


def recompute_floor(shape: Any, remat: Remat | CustomRemat, seq_len: int) -> float:
    """The least ``program matmul FLOPs / model FLOPs`` a plan with ``remat`` runs (module
    docstring), a preset or a per-tensor policy alike: what it keeps (on the device or the host)
    decides what backward computes again."""
    kept = _kept(remat)
    if kept is None:
        return 1.0  # `none`: every activation is kept
    parts = forward_matmul_flops_per_token(shape, seq_len)
    qkv = set(QKV[:3]) <= kept or QKV[3] in kept
    mlp_in = set(MLP_INPUTS[:2]) <= kept or MLP_INPUTS[2] in kept
    again = 0.0 if qkv else parts["qkv"] + parts["attention"]
    again += 0.0 if mlp_in else parts["mlp_in"]
    if qkv and CONTEXT_NAME in kept and OUT_PROJ not in kept:  # the MLP's input needs the out projection again
        again += parts["out"]
    return 1.0 + again / (3.0 * sum(parts.values()))  # the model's FLOPs: forward and backward, 3 x the forward


def _kept(remat: Remat | CustomRemat) -> set[str] | None:
    """MaxText's names of what ``remat`` keeps for backward (``None``: everything)."""
    custom = as_custom(remat)
    return None if custom is None else set(custom.kept_names)


def mfu_ceiling(
    shape: Any, remat: Remat | CustomRemat, seq_len: int, chip: str, calibration: Calibration = CALIBRATION
) -> float | None:
    """The highest predicted MFU a plan of ``shape`` with ``remat`` can reach on ``chip`` (a
    `ChipSpec.libtpu_name`, whose calibrated efficiencies the step-time model uses; module
    docstring); ``None`` for a model of no known shape (nothing is ruled out)."""
    if shape is None:
        return None
    return max(calibration.efficiencies(chip)) / recompute_floor(shape, remat, seq_len)


def runs_its_floor(report: Any, shape: Any) -> bool:
    """Whether a compiled plan's predicted program (`PlanReport`) runs at least its policy's floor
    of matmul FLOPs, so that its mesh's predictions stay under their ceilings (module docstring)."""
    e = report.estimate
    if shape is None or not e.predicted or e.model_flops_per_step <= 0:
        return False
    ratio = e.hardware_flops_per_device * report.devices / e.model_flops_per_step
    return ratio >= recompute_floor(shape, Remat.parse(report.remat), report.seq_len)
