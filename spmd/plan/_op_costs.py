"""The pieces of the step-time model that read one operation (pure Python): a matmul dim's fill
of the matrix unit, a splash attention kernel's matmuls, and which bytes of a fusion's operands
and results touch HBM (`spmd.plan._step_time` walks the program with them)."""

from __future__ import annotations

import math
import re

from spmd.inspector.hlo_text import Instruction

__all__ = [
    "SLICING",
    "dims",
    "fill",
    "in_place_update",
    "source",
    "splash_head_dim_matmuls",
    "splash_matmuls",
    "users_of",
    "uses",
]

SLICING = frozenset({"dynamic-slice", "slice", "gather"})


def dims(text: str | None) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\d+", text or ""))


def fill(size: int, mxu: int) -> float:
    """The share of the matrix unit a matmul dim of ``size`` keeps busy (padded to ``mxu``)."""
    return size / (math.ceil(size / mxu) * mxu) if size > 0 else 1.0


def _passes_through(inst: Instruction | None) -> bool:
    """A bitcast, or a nested fusion aliased to its one operand: the operand's bytes, in place."""
    if inst is None or not inst.operands:
        return False
    aliased = (
        inst.opcode == "fusion"
        and len(inst.operands) == 1
        and "output_to_operand_aliasing={{}: (0, {})}" in inst.attributes
    )
    return inst.opcode == "bitcast" or aliased


def source(name: str, local: dict[str, Instruction]) -> str:
    """What ``name`` is a pass-through view of (`_passes_through`), inside one fused computation."""
    for _ in range(16):
        inst = local.get(name)
        if not _passes_through(inst):
            break
        name = inst.operands[0]  # type: ignore[union-attr]
    return name


def uses(name: str, users: dict[str, list[Instruction]]) -> list[Instruction]:
    """The instructions that read ``name``, through pass-through views of it."""
    found: list[Instruction] = []
    for user in users.get(name, []):
        found += uses(user.name, users) if _passes_through(user) else [user]
    return found


def in_place_update(out: Instruction, local: dict[str, Instruction]) -> tuple[str, Instruction | None] | None:
    """``(the parameter updated, the update)`` when the fusion result ``out`` is a
    ``dynamic-update-slice`` of a parameter (through pass-through views either side), else ``None``."""
    for _ in range(16):
        if not _passes_through(out):
            break
        out = local.get(out.operands[0], out)
    if out.opcode != "dynamic-update-slice" or not out.operands:
        return None
    target = local.get(source(out.operands[0], local))
    if target is None or target.opcode != "parameter":
        return None
    return target.name, local.get(out.operands[1]) if len(out.operands) > 1 else None


def users_of(instructions: list[Instruction]) -> dict[str, list[Instruction]]:
    users: dict[str, list[Instruction]] = {}
    for inst in instructions:
        for operand in inst.operands:
            users.setdefault(operand, []).append(inst)
    return users


def splash_matmuls(name: str) -> int:
    """The matmuls of a splash attention kernel, by its name: forward 2 (q k^T, p v); the
    backward's dq kernel 3 (q k^T again, dO v^T, dS k), its dkv kernel 4 (q k^T, dO v^T, p^T dO,
    dS^T q), a fused backward (dkv computing dq too) 5; 0: not a splash kernel."""
    if not name.startswith("splash"):
        return 0
    if "dkv" in name:
        return 5 if "fused" in name else 4
    if "dq" in name:
        return 3
    return 2 if "fwd" in name or "bwd" not in name else 0


def splash_head_dim_matmuls(name: str) -> int:
    """Of `splash_matmuls`, those contracting over the head dim: q k^T in every kernel, and dO v^T
    in backward's (forward 1, dq 2, dkv 2, fused dkv 2); the rest contract over a block of queries
    or keys (p v, dS k, p^T dO, dS^T q)."""
    matmuls = splash_matmuls(name)
    return 0 if not matmuls else 1 if matmuls == 2 else 2
