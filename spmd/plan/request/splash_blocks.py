"""``--splash-blocks``: the splash attention kernel's block sizes, by MaxText's names.

Splash attention (`spmd.plan.request.attention`) tiles the sequence into blocks of queries and
keys and skips a pair of blocks that the mask leaves wholly empty; a block the mask cuts runs
whole. MaxText's recipes tune the eight sizes (``sa_block_q``, ``sa_block_kv``,
``sa_block_kv_compute``, ``sa_block_q_dkv``, ``sa_block_kv_dkv``, ``sa_block_kv_dkv_compute``,
``sa_block_q_dq``, ``sa_block_kv_dq``); ``--splash-blocks q=1024,kv=1024,q_dkv=512,...`` takes the
same names without ``sa_block_``, or one number for all eight (``2048,q_dkv=1024``: all 2048 but
one). A block left out is the planner's own (`splash_block`: the largest of 512, 256 and 128
dividing the sequence); a ``*_compute`` left out is its block's size.

``use_fused_bwd_kernel=true`` (MaxText's ``sa_use_fused_bwd_kernel``) runs the backward as one
kernel over the key gradient's blocks that computes the query gradient too (5 matmuls a block pair
where the two kernels run 4 and 3), as tuned recipes do; the query gradient's sizes are then
unused, as in MaxText, and not recorded. The fused kernel runs under a name scope of its own
(`spmd.plan.request.attention.FUSED_BACKWARD_SCOPE`), from which the step-time model costs it
(jax 0.12 names it as the unfused key-gradient kernel).

The sizes matter most with a sliding window: Gemma 3's 1,024-token window over blocks of 1,024
queries and keys runs two key blocks a query block, twice the pairs the window holds; with
``kv_dkv=2048`` and ``q_dkv=512`` the key gradient runs 2.98 times. A windowed kernel's name scope
carries its sizes (`spmd.plan.request.attention.window_scope`), from which the step-time model
costs the blocks it runs (`spmd.plan.predict._op_costs.attended_pairs`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from spmd.plan.errors import PlanError

__all__ = [
    "PLANNER_BLOCKS",
    "SplashBlocks",
    "check_no_context_axis",
    "parse_splash_blocks",
    "splash_block",
]

_LANE = 128  # the TPU's lane width: every block is a multiple of it


def splash_block(seq_len: int) -> int:
    """The splash kernel's block along the sequence: the largest of 512, 256, 128 dividing it.

    Raises:
        PlanError: the sequence is not a multiple of 128 (the TPU's lane width).
    """
    for block in (512, 256, _LANE):
        if seq_len % block == 0:
            return block
    raise PlanError(
        f"--attention flash needs a sequence length divisible by 128 (the splash kernel's blocks); got {seq_len}. "
        "Give --seq a multiple of 128, or --attention dot."
    )


@dataclass(frozen=True)
class SplashBlocks:
    """Splash attention's block sizes in tokens, by MaxText's names without ``sa_block_``;
    ``None``: the planner's own (module docstring). Each is a multiple of 128; a ``*_compute``
    size divides its block. ``use_fused_bwd_kernel``: one backward kernel (module docstring)."""

    q: int | None = None
    kv: int | None = None
    kv_compute: int | None = None
    q_dkv: int | None = None
    kv_dkv: int | None = None
    kv_dkv_compute: int | None = None
    q_dq: int | None = None
    kv_dq: int | None = None
    use_fused_bwd_kernel: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.use_fused_bwd_kernel, bool):
            raise PlanError(
                f"splash use_fused_bwd_kernel must be a bool, got {type(self.use_fused_bwd_kernel).__name__} "
                f"{self.use_fused_bwd_kernel!r:.40}."
            )
        for f in _size_fields():
            size = getattr(self, f.name)
            if size is None:
                continue
            if not isinstance(size, int) or isinstance(size, bool):
                raise PlanError(
                    f"splash block {f.name} must be an int (tokens), got {type(size).__name__} {size!r:.40}."
                )
            if size < 1 or size % _LANE:
                raise PlanError(
                    f"splash block {f.name}={size} is not a positive multiple of {_LANE} (the TPU's lane width)."
                )

    def resolved(self, seq_len: int) -> dict[str, int]:
        """The eight sizes for a kernel over ``seq_len`` tokens: each given one, else the planner's.

        Raises:
            PlanError: a block does not divide ``seq_len``, or a compute size its block.
        """
        default = splash_block(seq_len)
        out = {f.name: getattr(self, f.name) or default for f in _size_fields() if not f.name.endswith("_compute")}
        out["kv_compute"] = self.kv_compute or out["kv"]
        out["kv_dkv_compute"] = self.kv_dkv_compute or out["kv_dkv"]
        if self.use_fused_bwd_kernel:  # the query gradient runs in the key gradient's kernel, on its blocks
            out["q_dq"], out["kv_dq"] = out["q_dkv"], out["kv_dkv"]
        for name, size in out.items():
            whole = out[name.removesuffix("_compute")] if name.endswith("_compute") else seq_len
            if whole % size:
                of = (
                    f"its block {name.removesuffix('_compute')}={whole}"
                    if name.endswith("_compute")
                    else f"the {seq_len}-token sequence"
                )
                raise PlanError(f"splash block {name}={size} does not divide {of}. Give a divisor.")
        return out

    @property
    def unused(self) -> tuple[str, ...]:
        """The sizes no kernel takes: the query gradient's under the fused backward."""
        return ("q_dq", "kv_dq") if self.use_fused_bwd_kernel else ()

    @property
    def given(self) -> dict[str, int | bool]:
        """The sizes given that the kernels use (not `unused`), by name, and
        ``use_fused_bwd_kernel: True`` if set (what a report and the compile cache record)."""
        given: dict[str, int | bool] = {
            f.name: getattr(self, f.name)
            for f in _size_fields()
            if getattr(self, f.name) is not None and f.name not in self.unused
        }
        return {**given, "use_fused_bwd_kernel": True} if self.use_fused_bwd_kernel else given


def _size_fields() -> tuple[Any, ...]:
    return tuple(f for f in fields(SplashBlocks) if f.name != "use_fused_bwd_kernel")


_NAMES = tuple(f.name for f in _size_fields())
PLANNER_BLOCKS = SplashBlocks()  # none given: the planner's own sizes


_FUSED = "use_fused_bwd_kernel"
_BOOLS = {"true": True, "false": False}


def parse_splash_blocks(text: str) -> SplashBlocks:
    """``"1024"`` (all eight), ``"q=1024,kv=1024,q_dkv=512"`` (MaxText's names; ``sa_block_``
    may prefix them), both (``"2048,q_dkv=1024"``: the number first), and
    ``use_fused_bwd_kernel=true`` (``sa_`` may prefix it) as `SplashBlocks`.

    Raises:
        PlanError: an unknown name, a repeated one, or a value that is not a whole number (a
            size) or true / false (the fused kernel).
    """
    items = [part.strip() for part in text.split(",")]
    values: dict[str, Any] = {}
    if items and re.fullmatch(r"\d{1,9}", items[0]):
        values = dict.fromkeys(_NAMES, int(items.pop(0)))
    named: set[str] = set()
    for item in filter(None, items):
        name, eq, value = (s.strip() for s in item.partition("="))
        name = _FUSED if name == f"sa_{_FUSED}" else name.removeprefix("sa_block_")
        if name == _FUSED and eq and value.lower() in _BOOLS and name not in named:
            values[name] = _BOOLS[value.lower()]
        elif eq and name in _NAMES and name not in named and re.fullmatch(r"\d{1,9}", value):
            values[name] = int(value)
        else:
            raise PlanError(
                f"cannot read splash block {item!r:.60}. Give one size for all first, then name=size pairs from "
                f"{', '.join(_NAMES)} (MaxText's sa_block_ names), each once, and {_FUSED}=true|false, e.g. "
                "q=1024,kv=1024,q_dkv=512 or 2048,use_fused_bwd_kernel=true."
            )
        named.add(name)
    if not values:
        raise PlanError("the splash blocks are empty: give one size for all, or name=size pairs (q=1024,kv=1024).")
    return SplashBlocks(**values)


def check_no_context_axis(blocks: SplashBlocks) -> None:
    """Refuse sizes given for a plan that splits the sequence over a context axis: context
    parallelism runs its own kernel (`spmd.plan.request.context`), all eight blocks the largest of
    512, 256 and 128 dividing a shard's queries.

    Raises:
        PlanError: ``blocks`` gives a size.
    """
    if blocks.given:
        raise PlanError(
            "--splash-blocks sets the kernel of a mesh without a context axis; context parallelism runs its own "
            "kernel, its blocks the largest of 512, 256 and 128 dividing a shard's queries. Plan without "
            "--splash-blocks, or on a mesh without context."
        )
