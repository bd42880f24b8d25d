"""What a repeated block keeps for backward, named and read back.

`named_projections` names each projection's output of a block as MaxText names it (`spmd.plan.request.remat`),
so that a remat policy can keep it by name; `saved_residuals` reads from the traced step what the
block scan then keeps: JAX's own residuals, one `SavedActivation` per array, which the tests hold
against each policy's MaxText names and against our memory math (`spmd.plan.predict.memory`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from spmd.plan._jax_compat import scan_stacked_outputs
from spmd.plan.request.custom_remat import MLP_OUT, OUT_PROJ, CustomRemat
from spmd.plan.request.remat import Remat, host_names, projection_name

__all__ = [
    "LAYER_SCAN_SCOPE",
    "SavedActivation",
    "in_layer_scan",
    "named_projections",
    "row_major_names",
    "saved_residuals",
]

# The name scope the block scan runs under (`in_layer_scan`): the step has other scans (the
# vocabulary's tiles), and one may have as many trips as the stack.
LAYER_SCAN_SCOPE = "layer_scan"

# What a block adds to the residual stream. Offloaded, libtpu lays such a projection's output out
# sequence minor-most ({1,2,0} of [batch, seq, width]), and the forward scan's carry, the sum,
# with it; the forward then writes it and the layer input to the host so, while the backward scan
# reads both with the stream's gradient, row-major ({2,1,0}). A stack in host memory cannot be
# relaid in place: between the scans each crossed PCIe to the device and back (the v6e 8B's 4 x 8
# GiB, 2.15 s a step). Pinned row-major on both sides of its name, the output keeps the carry
# row-major too, and the forward writes what the backward reads. q, k and v are left to libtpu:
# both scans take them sequence minor-most (pinned, they were relaid instead).
_ADDED_TO_STREAM = (OUT_PROJ, MLP_OUT)


@dataclass(frozen=True)
class SavedActivation:
    """One array a block keeps for backward: its global shape (one layer's), dtype, and whether
    it is kept in host memory (``offload``)."""

    shape: tuple[int, ...]
    dtype: str
    on_host: bool = False

    @property
    def nbytes(self) -> int:
        import numpy as np

        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def in_layer_scan() -> contextlib.AbstractContextManager[None]:
    """A context in which a ``lax.scan`` is the block scan `saved_residuals` reads."""
    import jax

    return jax.named_scope(LAYER_SCAN_SCOPE)


def _is_layer_scan(eqn: Any) -> bool:
    """A forward ``scan`` run `in_layer_scan`: its name stack (``jvp(layer_scan)`` once
    differentiated) has the scope as one of its names."""
    if eqn.primitive.name != "scan" or eqn.params["reverse"]:
        return False
    return LAYER_SCAN_SCOPE in re.split(r"[/()]", str(eqn.source_info.name_stack))


def saved_residuals(jaxpr: Any) -> tuple[SavedActivation, ...]:
    """What the forward block scan stacks for backward, per trip, read from the step's ``jaxpr``:
    the stacked outputs (``ys``) of the forward ``scan`` run `in_layer_scan` (the block returns
    no ``ys`` of its own, so every one is a residual of the remat policy). Other scans of the
    step, whatever their length, are not the block's."""
    found: list[SavedActivation] = []

    def walk(j: Any) -> None:
        for eqn in j.eqns:
            if _is_layer_scan(eqn):
                for var in scan_stacked_outputs(eqn):
                    aval = var.aval
                    host = "host" in str(getattr(aval, "memory_space", "")).lower()
                    found.append(SavedActivation(tuple(aval.shape[1:]), str(aval.dtype), host))
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    walk(inner)

    walk(jaxpr)
    return tuple(found)


def row_major_names(remat: Remat | CustomRemat) -> frozenset[str]:
    """The projections `named_projections` lays out row-major under ``remat``: those added to the
    residual stream that ``remat`` moves to the host (`_ADDED_TO_STREAM`). Other plans lower as
    they did."""
    return frozenset(n for n in host_names(remat) if n in _ADDED_TO_STREAM)


def _row_major(value: Any) -> Any:
    from jax.experimental.layout import Layout, with_layout_constraint

    return with_layout_constraint(value, Layout(tuple(range(value.ndim))))


def _named(value: Any, name: str, row_major: frozenset[str]) -> Any:
    """``value`` named ``name`` for the remat policy; when ``name`` is in ``row_major``, laid out
    row-major on both sides of the name: the value the forward writes to the host, and the value the
    backward reads back (`_ADDED_TO_STREAM` on why)."""
    from jax.ad_checkpoint import checkpoint_name

    if name not in row_major:
        return checkpoint_name(value, name)
    return _row_major(checkpoint_name(_row_major(value), name))


def _is_projection(module: torch.nn.Module) -> bool:
    """A matmul with a weight: ``nn.Linear``, or the ``Conv1D`` GPT-2 uses for its projections."""
    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


@contextlib.contextmanager
def named_projections(block: torch.nn.Module, env: Any, row_major: frozenset[str] = frozenset()) -> Iterator[list[str]]:
    """Inside, each projection of ``block`` names its output as MaxText does (`projection_name`),
    so that a remat policy can keep it by name (those in ``row_major`` laid out row-major,
    `row_major_names`); yields the names given, in module order. The hooks come off on exit: the
    model is left as it was."""
    handles, names = [], []
    for path, module in block.named_modules():
        if not path or not _is_projection(module):
            continue
        name = projection_name(path)

        def hook(_module: Any, _args: Any, out: Any, name: str = name) -> Any:
            return env.j2t_iso(_named(env.t2j_iso(out), name, row_major))

        handles.append(module.register_forward_hook(hook))
        names.append(name)
    try:
        yield names
    finally:
        for handle in handles:
            handle.remove()
