"""`visualize_sharding`: a table of which device holds which block, like JAX's
``jax.debug.visualize_array_sharding``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from mesh.checks import is_int
from spmd.errors import SpmdTypeError
from spmd.sharded_tensor import ShardedTensor
from spmd.sharding import NamedSharding, PartitionSpec, ShardBounds

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["ShardingLayout", "sharding_layout", "visualize_sharding"]


@dataclass(frozen=True)
class ShardingLayout:
    """Blocks of a tensor laid out as a grid of rows x columns (dims 0 and 1).

    ``cells[r][c]`` is ``(row range, column range, device ids holding the block)``.
    Higher-rank tensors list one row per block (``columns == 1``).
    """

    shape: tuple[int, ...]
    cells: tuple[tuple[tuple[str, str, tuple[int, ...]], ...], ...]


def _span(s: slice) -> str:
    return f"{s.start}:{s.stop}"


def sharding_layout(shape: Sequence[int], bounds: Sequence[ShardBounds]) -> ShardingLayout:
    """Group ``bounds`` by block and arrange the blocks in a grid."""
    shape = tuple(shape)
    blocks: dict[tuple[int, ...], list[ShardBounds]] = {}
    for b in bounds:
        blocks.setdefault(b.tile_index, []).append(b)
    keys = sorted(blocks)
    if len(shape) in (1, 2):
        rows = sorted({k[0] for k in keys}) if shape else [0]
        cols = sorted({k[1] for k in keys}) if len(shape) == 2 else [0]
        grid = []
        for r in rows:
            line = []
            for c in cols:
                key = (r, c) if len(shape) == 2 else (r,)
                group = blocks[key]
                idx = group[0].index
                line.append(
                    (_span(idx[0]), _span(idx[1]) if len(shape) == 2 else "", tuple(sorted(g.device for g in group)))
                )
            grid.append(tuple(line))
        return ShardingLayout(shape, tuple(grid))
    grid = []
    for k in keys:
        idx = blocks[k][0].index
        grid.append(((", ".join(_span(s) for s in idx), "", tuple(sorted(g.device for g in blocks[k]))),))
    return ShardingLayout(shape, tuple(grid))


def visualize_sharding(
    tensor: torch.Tensor | ShardedTensor,
    sharding: NamedSharding | None = None,
    *,
    console: Console | None = None,
) -> Table | None:
    """Print (and return) a rich table of which devices hold which block of ``tensor``; for a
    traced value whose layout the compiler has not assigned yet, print that and return ``None``.

    Args:
        tensor: a `ShardedTensor`, or a tensor plus its ``sharding``; any object with a
            ``.shape`` works with ``sharding`` given, so no device is needed.
        sharding: the sharding, when ``tensor`` is not a `ShardedTensor`.
        console: a ``rich.console.Console`` to print to (default: stdout).
    """
    from rich.markup import escape
    from rich.table import Table

    _check_arguments(tensor, sharding, console)
    if isinstance(tensor, ShardedTensor) and sharding is None:
        shape = tensor.global_shape
        sharding = tensor.sharding
        if sharding is None:  # computed from a sharded tensor: the runtime's sharding, no mesh
            hlo = tensor.hlo_sharding
            if hlo is None:  # pytorch/xla#7846: a traced value's layout is the compiler's to choose
                console = console or _console()
                console.print(f"{tuple(shape)}: not assigned yet (the compiler decides)", soft_wrap=True)
                return None
            bounds, title = tensor.shard_bounds, f"{tuple(shape)} sharded as computed"
    else:
        if sharding is None:
            raise SpmdTypeError(
                "visualize_sharding needs an XLAShardedTensor (what mark_sharding returns) or a "
                "tensor plus sharding=NamedSharding(mesh, spec)."
            )
        shape = tuple(tensor.shape)
    if sharding is not None:
        hlo = sharding.hlo_sharding(len(shape), shape)
        bounds, title = sharding.shard_bounds(shape), f"{tuple(shape)} {sharding.spec!r} on {sharding.mesh.describe()}"
    layout = sharding_layout(shape, bounds)
    table = Table(show_header=False, show_lines=True)
    for _ in layout.cells[0]:
        table.add_column(justify="center")
    for row in layout.cells:
        table.add_row(*[escape(f"[{r}{', ' + c if c else ''}]") + f"\ndev {', '.join(map(str, d))}" for r, c, d in row])
    console = console or _console()
    console.print(title, soft_wrap=True)
    console.print(table)
    console.print(str(hlo), soft_wrap=True, markup=False, highlight=False)
    return table


def _check_arguments(tensor: object, sharding: object, console: object) -> None:
    """Types only, before anything is drawn (a wrong one failed deep inside with AttributeError)."""
    from rich.console import Console

    if sharding is not None and not isinstance(sharding, NamedSharding):
        fix = f"; write NamedSharding(mesh, {sharding!r:.80})" if isinstance(sharding, PartitionSpec) else ""
        raise SpmdTypeError(
            f"visualize_sharding's sharding is a NamedSharding(mesh, spec), got {type(sharding).__name__}{fix}."
        )
    shape = getattr(tensor, "shape", None)
    if not isinstance(tensor, ShardedTensor) and not (isinstance(shape, Sequence) and all(is_int(n) for n in shape)):
        raise SpmdTypeError(
            f"visualize_sharding draws a tensor (anything with a .shape of ints), got {tensor!r:.80} "
            f"({type(tensor).__name__})."
        )
    if console is not None and not isinstance(console, Console):
        raise SpmdTypeError(
            f"console is a rich.console.Console or None, got {console!r:.80} ({type(console).__name__})."
        )


def _console() -> Any:
    from rich.console import Console

    return Console()
