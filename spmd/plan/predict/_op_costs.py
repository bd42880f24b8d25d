"""The pieces of the step-time model that read one operation (pure Python): a matmul dim's fill
of the matrix unit, a splash attention kernel's matmuls, and which bytes of a fusion's operands
and results touch HBM (`spmd.plan.predict._step_time` walks the program with them)."""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from spmd.hlo import Instruction
from spmd.plan.request.attention import FUSED_BACKWARD_SCOPE, PHASE_BLOCKS, WINDOW_SCOPE

__all__ = [
    "SLICING",
    "SplashWindow",
    "attended_pairs",
    "declared_blocks",
    "dims",
    "fill",
    "in_place_update",
    "source",
    "splash_head_dim_matmuls",
    "splash_matmuls",
    "splash_phase",
    "splash_window",
    "users_of",
    "uses",
    "window_taps",
]

SLICING = frozenset({"dynamic-slice", "slice", "gather"})


def dims(text: str | None) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\d+", text or ""))


def fill(size: int, mxu: int) -> float:
    """The share of the matrix unit a matmul dim of ``size`` keeps busy (padded to ``mxu``)."""
    return size / (math.ceil(size / mxu) * mxu) if size > 0 else 1.0


def _window_fields(window: str) -> dict[str, list[str]]:
    """``size=16 stride=15 pad=15_15 lhs_dilate=16`` as ``{"size": ["16"], ...}``: each field's
    value per spatial dim (HLO joins them with ``x``)."""
    parts = (p.split("=", 1) for p in window.strip().strip("{}").split() if "=" in p)
    return {key: value.split("x") for key, value in parts}


def window_taps(window: str | None, lhs_lengths: tuple[int, ...], out_lengths: tuple[int, ...]) -> float:
    """The window taps of a ``convolution`` that meet a real input element, averaged over its
    output positions and multiplied over its spatial dims: what each output element's
    multiply-adds are, per input feature.

    The TPU compiler writes batched matmuls as convolutions whose window runs over the batch: a
    window of 16 over an input of length 1 padded by 15 (one tap meets it), or over an input of
    length 16 dilated by 16 (``lhs_dilate=16``: 15 holes between elements) with a stride of 15, so
    that each output position again meets one element. Counting ``size`` taps made such a matmul
    16 times its FLOPs. Padding and holes are counted out exactly, position by position; a
    ``rhs_dilate`` spaces the taps.
    """
    import numpy as np

    fields = _window_fields(window or "")
    sizes = [int(v) for v in fields.get("size", [])]
    if len(sizes) != len(lhs_lengths) or len(out_lengths) != len(sizes):
        return float(math.prod(min(s, n) for s, n in zip(sizes, lhs_lengths, strict=False))) if sizes else 1.0

    def each(key: str, default: int) -> list[int]:
        values = fields.get(key)
        return [int(v) for v in values] if values and len(values) == len(sizes) else [default] * len(sizes)

    strides, lhs_dilate, rhs_dilate = each("stride", 1), each("lhs_dilate", 1), each("rhs_dilate", 1)
    pads = fields.get("pad")
    lows = [int(p.split("_")[0]) for p in pads] if pads and len(pads) == len(sizes) else [0] * len(sizes)
    taps = 1.0
    for size, stride, dl, dr, low, n, out in zip(
        sizes, strides, lhs_dilate, rhs_dilate, lows, lhs_lengths, out_lengths, strict=True
    ):
        if out <= 0:
            return 0.0
        position = np.arange(out)[:, None] * stride + np.arange(size)[None, :] * dr - low  # in the dilated input
        real = (position >= 0) & (position % dl == 0) & (position // dl < n)
        taps *= float(real.sum()) / out
    return taps


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


# A splash kernel's name: ``splash_mha_fwd_residuals`` (jax 0.12); jax 0.7 appends its block
# sizes (``splash_mha_fwd_residuals_block_kv_512_..._block_kv_dkv_512_..._use_fused_bwd_kernel_False``),
# so a forward kernel's name holds "dkv" and "fused": the phase is the word after the attention type.
_SPLASH_PHASE = re.compile(r"splash_m[hq]a_(fwd|dq|dkv)(?![a-z])")
# jax 0.7 writes the flag into the kernel's name; jax 0.12 does not, and the planner runs a fused
# backward under FUSED_BACKWARD_SCOPE (`spmd.plan.request.attention`), read from the op's name
_FUSED_BACKWARD = re.compile(rf"use_fused_bwd_kernel[=_]True|[/(]{FUSED_BACKWARD_SCOPE}[/)]")


def splash_phase(name: str) -> str | None:
    """``fwd``, ``dq`` or ``dkv``: the pass of the splash kernel named ``name``; ``None``: not one."""
    found = _SPLASH_PHASE.match(name)
    return found.group(1) if found else None


def splash_matmuls(name: str, op_name: str = "") -> int:
    """The matmuls of a splash attention kernel, by its name: forward 2 (q k^T, p v); the
    backward's dq kernel 3 (q k^T again, dO v^T, dS k), its dkv kernel 4 (q k^T, dO v^T, p^T dO,
    dS^T q), a fused backward (dkv computing dq too: jax 0.7's name says so, or the kernel's
    ``op_name`` metadata holds the planner's fused scope) 5; 0: not a splash kernel."""
    phase = splash_phase(name)
    if phase == "dkv":
        return 5 if _FUSED_BACKWARD.search(name) or _FUSED_BACKWARD.search(op_name) else 4
    return {"fwd": 2, "dq": 3}.get(phase or "", 0)


class SplashWindow(NamedTuple):
    """A windowed splash kernel's scope (`spmd.plan.request.attention.window_scope`): its window
    and the (query, key) block sizes of forward, the key gradient and the query gradient."""

    window: int
    blocks: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]

    def blocks_of(self, kernel: str) -> tuple[int, int] | None:
        """The (query, key) blocks the kernel named ``kernel`` runs (a fused backward's are the
        key gradient's); ``None``: not a splash kernel."""
        phase = splash_phase(kernel)
        return None if phase is None else self.blocks[list(PHASE_BLOCKS).index(phase)]


# every scope the planner writes holds its blocks (compile cache format 7 and later)
_WINDOW_SCOPE = re.compile(rf"[/(]{WINDOW_SCOPE}(\d+)_blocks_(\d+)x(\d+)_(\d+)x(\d+)_(\d+)x(\d+)[/)]")


def splash_window(op_name: str) -> SplashWindow | None:
    """The sliding window of the splash kernel named ``op_name`` in the HLO's metadata (the
    ``splash_window_<W>_blocks_...`` scope the planner runs a windowed kernel under,
    `spmd.plan.request.attention`); ``None``: causal over every earlier key."""
    found = _WINDOW_SCOPE.search(op_name)  # jvp(splash_window_128_blocks_...)/... too
    if not found:
        return None
    q, kv, q_dkv, kv_dkv, q_dq, kv_dq = (int(g) for g in found.groups()[1:])
    return SplashWindow(int(found.group(1)), ((q, kv), (q_dkv, kv_dkv), (q_dq, kv_dq)))


def attended_pairs(queries: int, keys: int, window: int | None, blocks: tuple[int, int] | None = None) -> float:
    """(query, key) pairs a causal splash kernel computes: half the square (``queries x keys /
    2``), or with a ``window`` each query's last ``window`` keys, itself included (fewer for the
    first ``window`` queries). With ``blocks``, its (query, key) block sizes, each pair of blocks
    the mask reaches is counted whole, as the kernel runs it (it skips only the pairs the mask
    leaves empty): over ``n`` blocks a side a causal kernel runs ``n (n + 1) / 2`` pairs, ``1 /
    n`` more than half the square (1.6 % over 64 blocks, 6.3 % over 16), and Gemma 3's window of
    1,024 over blocks of 1,024 runs two key blocks a query block, twice the window's pairs. A
    causal kernel whose queries are not its keys (a shard of a context-parallel sequence beside
    another) keeps the half: which part of it the diagonal crosses is not in its shapes."""
    if window is not None and window >= keys:
        window = None
    if blocks is None or (window is None and queries != keys):
        return queries * keys / 2 if window is None else queries * window - window * (window - 1) / 2
    block_q, block_kv = blocks
    touched = 0
    for start in range(0, queries, block_q):
        last = min(start + block_q, keys) - 1  # the block's last query sees keys up to itself
        first = 0 if window is None else max(0, start - window + 1)  # and its first query none before this
        touched += last // block_kv - first // block_kv + 1
    return float(touched * block_q * block_kv)


def declared_blocks(name: str, attributes: str) -> tuple[int, int] | None:
    """The (query, key) block sizes the splash kernel named ``name`` declares (its phase's:
    forward, key gradient or query gradient); ``None``: not a splash kernel, or one that declares
    none. jax 0.12 declares them in its ``xprof_metadata`` (a JSON object in the HLO's attributes,
    its quotes escaped), jax 0.7 in its name (``..._block_q_dkv_512_...``), each as ``block_<size>``."""
    phase = splash_phase(name)
    if phase is None:
        return None
    found = []
    for key in (f"block_{size}" for size in PHASE_BLOCKS[phase]):
        value = re.search(rf'\\?"{key}\\?"\s*:\s*(\d+)', attributes) or re.search(rf"(?<![a-z]){key}_(\d+)(?!\d)", name)
        if value is None:
            return None
        found.append(int(value.group(1)))
    return found[0], found[1]


def splash_head_dim_matmuls(name: str, op_name: str = "") -> int:
    """Of `splash_matmuls`, those contracting over the head dim: q k^T in every kernel, and dO v^T
    in backward's (forward 1, dq 2, dkv 2, fused dkv 2); the rest contract over a block of queries
    or keys (p v, dS k, p^T dO, dS^T q)."""
    matmuls = splash_matmuls(name, op_name)
    return 0 if not matmuls else 1 if matmuls == 2 else 2
