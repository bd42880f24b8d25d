"""Checkpoints that cross lanes: FSDP saved on the torch_xla lane (GSPMD, torch 2.9, 8 devices)
resumes on the current lane (DTensor, torch 2.15, 4 processes under torchrun), and the reverse.

Each lane cannot run the other's torch, so each lane's checkpoint is kept in tests/data/cross_lane/
with what the uninterrupted run gave after it. Regenerate one (after a format change) on its lane:

    python -m tests.fsdp_xla.cross_lane save       # torch_xla lane: GSPMD in this process
    python -m tests.fsdp_xla.cross_lane save       # current lane: launches itself under torchrun

``save`` trains 2 AdamW steps, saves model + optimizer, trains 2 more, and records those 2 losses
with the versions that made it. ``resume DIR OUT.json`` (run by the tests on the other lane) loads
DIR into other initial weights and trains the same 2 steps. The batches come from numpy's PCG64,
the same on every torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "cross_lane"
CONFIG = dict(vocab=32, d_model=32, n_head=2, n_layer=2, seq=8)
BATCH, STEPS_BEFORE, STEPS_AFTER, LR = 8, 2, 2, 1e-2


def lane() -> str:
    """``torch_xla`` where torch_xla is installed, else ``current``."""
    return "torch_xla" if importlib.util.find_spec("torch_xla") is not None else "current"


def batches() -> list[torch.Tensor]:
    rng = np.random.default_rng(2026)
    out = []
    for _ in range(STEPS_BEFORE + STEPS_AFTER):
        start = rng.integers(0, CONFIG["vocab"], (BATCH, 1))
        stride = rng.integers(1, 4, (BATCH, 1))
        out.append(torch.from_numpy((start + stride * np.arange(CONFIG["seq"] + 1)) % CONFIG["vocab"]))
    return out


def _model(seed: int, mesh_size: int):
    from examples.train_fsdp import GPT, Block
    from fsdp_xla import FSDP, transformer_auto_wrap_policy
    from mesh import Mesh

    torch.manual_seed(seed)
    mesh = Mesh(np.arange(mesh_size), (mesh_size,), ("fsdp",))
    model = FSDP(GPT(**CONFIG), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))
    return model, torch.optim.AdamW(model.parameters(), lr=LR), mesh


def _steps_on_torch_xla(model, optimizer, mesh, data) -> list[float]:
    import torch_xla

    from examples.train_fsdp import xla_step

    losses = []
    for tokens in data:
        loss = xla_step(model, optimizer, tokens, mesh)
        torch_xla.sync()
        losses.append(loss.item())
    return losses


def _steps_on_dtensor(model, optimizer, data) -> list[float]:
    from examples.train_fsdp import rank_step

    return [rank_step(model, optimizer, tokens) for tokens in data]


def _run(action: str, directory: Path) -> dict:
    """``save`` into, or ``resume`` from, ``directory`` on this lane; the losses after step 2."""
    import fsdp_xla.checkpoint as ck

    data = batches()
    if lane() == "torch_xla":
        from spmd import configure_default_devices, enable_spmd

        configure_default_devices(8)
        enable_spmd()
        size, steps = 8, _steps_on_torch_xla
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        size = dist.get_world_size()

        def steps(model, optimizer, mesh, batch):
            return _steps_on_dtensor(model, optimizer, batch)

    model, optimizer, mesh = _model(0 if action == "save" else 7, size)
    if action == "save":
        steps(model, optimizer, mesh, data[:STEPS_BEFORE])
        ck.save_sharded(directory, model, optimizer, extra={"steps": STEPS_BEFORE})
        extra = {"steps": STEPS_BEFORE}
    else:
        extra = ck.load_sharded(directory, model, optimizer)
    return {"extra": extra, "losses": steps(model, optimizer, mesh, data[STEPS_BEFORE:]), "processes": size}


def _versions() -> dict:
    found = {"torch": torch.__version__}
    if lane() == "torch_xla":
        import torch_xla

        found["torch_xla"] = torch_xla.__version__
    return found


def _writes_results() -> bool:
    """One process writes: the torch_xla lane's only one, or rank 0 under torchrun."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _finish() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    action = argv[0]
    if action == "save" and lane() == "current" and "RANK" not in os.environ:  # launch the 4 processes
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4"]
        return subprocess.run([*command, "-m", "tests.fsdp_xla.cross_lane", "save"], cwd=ROOT).returncode
    if action == "save":
        target = DATA / lane()
        if _writes_results():
            shutil.rmtree(target, ignore_errors=True)
        result = _run("save", target / "checkpoint")
        if _writes_results():
            expected = {"losses_after_resume": result["losses"], "saved_by": _versions(), "config": CONFIG, "lr": LR}
            (target / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    else:
        result = _run("resume", Path(argv[1]))
        if _writes_results():
            Path(argv[2]).write_text(json.dumps(result))
    _finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
