"""The planner tests that lower or compile a step do it in a fresh interpreter (libtpu and jax stay
out of the test session, torch_xla out of its environment), in the background.

Each such run is a module-level `BackgroundRun` at nice 19 (tests/background.py), and each test
that reads one says so with ``@pytest.mark.reads(RUN)``: the session queues the runs the selected
tests read, one compile at a time while the other tests run (a compile is 5 to 35 s of one core,
and the multi-process tests leave a core idle while they wait), and their tests, ordered near the
end, read the results.
"""

from collections.abc import Callable

import pytest

from tests.background import BackgroundRun
from tests.conftest import HAS_TORCH_XLA


def python_code(code: str, config: dict, *args: str, timeout: float) -> BackgroundRun:
    """``python -c CODE CONFIG ARGS...``: a lowering or compile the test then reads as JSON."""
    return BackgroundRun(("-c", code), config, *args, timeout=timeout, warm=True)


# One flash step of the model in CONFIG on v5e:2x2 (fsdp 4, batch 4 x SEQ, remat dots) with the
# splash blocks (`spmd.plan.request.splash_blocks`) and SEQ in ARGS: its layers scanned, and each
# splash kernel's name scope, block table and cost in the step-time model.
_SPLASH_STEP = r"""
import json, re, sys
from spmd.hlo import HloModuleText
from spmd.plan.api import _lower, _request
from spmd.plan.compile.step import compile_step
from spmd.plan.predict import predict_step
from spmd.plan.request.models import build_meta_model
from spmd.plan.request.settings import PlanSettings

seq = int(sys.argv[3])
settings = PlanSettings("v5e:2x2", 1, seq, "bfloat16", "flash", None, "float32", 1, sys.argv[2])
module, hf_config = build_meta_model(sys.argv[1])
request = _request(settings, "fsdp", None, 4, "dots", 4)
lowered, _, _ = _lower(request, module, hf_config, seq, None)
hlo = compile_step(lowered.lowered).hlo_text
kernels = {
    inst.name: {
        "scope": inst.metadata.get("op_name", ""),
        "grid": re.search(r"s(?:8|16|32)\[([\d,]+)\]", inst.attribute("operand_layout_constraints") or "").group(1),
    }
    for instructions in HloModuleText.parse(hlo).computations.values()
    for inst in instructions
    if inst.name.startswith("splash_mha")
}
flops = {e.op: e.flops_per_run for e in predict_step(hlo, request.target).flops_by_op if e.op in kernels}
print(json.dumps({"scanned": lowered.scanned_layers, "kernels": kernels, "flops": flops}))
"""


def splash_step(config: dict, blocks: str, seq: int) -> BackgroundRun:
    """A flash step of ``config`` at sequence length ``seq`` with ``--splash-blocks blocks``
    (`_SPLASH_STEP`), in the background."""
    return python_code(_SPLASH_STEP, config, blocks, str(seq), timeout=1200)


def on_demand_on_torch_xla(test: Callable) -> Callable:
    """Mark a test slow (run by ``pytest -m slow``) on the torch_xla lane only.

    For the planner's feature checks that compile: each is the same lowering through the same
    planner code on both lanes, and what differs is the compiler. The torch_xla lane's (libtpu
    0.0.20, jax 0.7.1) compiled them 1.1 to 2.4 times slower, and the planner's compiles were half
    of that lane's CPU (965 of 1,829 core-s, measured 2026-12-02). The current lane checks them
    every run, with the libtpu TorchTPU runs on; the torch_xla lane compiles each jax 0.7.1 path
    the planner has every run all the same: plans through the CLI (the advisor's), two slices (the
    DCN mesh), splash kernels (the Mosaic IR cap, test_fused_backward), per-tensor remat and
    offload lowered (the layer scan's stacked outputs), and libtpu's start-up (test_quiet_start).
    """
    return pytest.mark.slow(test) if HAS_TORCH_XLA else test
