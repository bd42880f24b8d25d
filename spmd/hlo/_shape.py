"""HLO shapes: element types and their bytes, arrays (``f32[64,16]``) and the leaves of a tuple
shape, read from HLO text (pure Python)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["ArrayShape", "parse_shape", "DTYPE_BYTES"]

# Bytes per element of XLA's primitive types (sub-byte types rounded up, as buffers are).
DTYPE_BYTES: dict[str, int] = {
    "pred": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "token": 0,
}

_ARRAY_RE = re.compile(r"(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[0-9,\s]*)\](?:\{[^}]*\})?")


@dataclass(frozen=True)
class ArrayShape:
    """One array's element type and dims, e.g. ``f32[64,16]``."""

    dtype: str
    dims: tuple[int, ...]

    @property
    def elements(self) -> int:
        """The number of elements."""
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        """Bytes of a dense buffer of this shape."""
        return self.elements * DTYPE_BYTES.get(self.dtype, 4)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


def parse_shape(text: str) -> tuple[ArrayShape, ...]:
    """The arrays of an HLO shape: one for an array shape, the leaves of a tuple shape."""
    cleaned = re.sub(r"/\*.*?\*/", "", text)
    out = []
    for m in _ARRAY_RE.finditer(cleaned):
        dims_text = m.group("dims").strip()
        dims = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
        out.append(ArrayShape(m.group("dtype"), dims))
    return tuple(out)
