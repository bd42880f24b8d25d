"""Private symbols of an upstream library (torch, jax), each named once in its compat home.

`spmd._util.torch_compat` and `spmd.plan._jax_compat` each hold a table of the private symbols the
product imports, by the name callers import them under (``from spmd._util.torch_compat import
FakeTensor``). A symbol is imported when first asked for, so a home costs nothing at import time
and a missing symbol fails only where it is used, with an error naming the upstream path, the
release and the compat name. tests/test_private_upstream.py resolves every symbol on each lane.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["PrivateSymbol", "PrivateSymbolError", "resolver"]


class PrivateSymbolError(ImportError):
    """An upstream release moved or removed a private symbol the product imports."""


@dataclass(frozen=True)
class PrivateSymbol:
    """``module`` (an upstream module path), or its attribute ``attribute`` (dotted for an
    attribute of a class: ``Tensor._make_wrapper_subclass``). Every symbol exists on
    both lanes (torch 2.9 and 2.15, jax 0.7.1 and 0.12): a home that needs one a lane lacks says
    so with feature detection, as `spmd._util.torch_compat`'s functions do."""

    module: str
    attribute: str | None = None

    @property
    def path(self) -> str:
        return self.module if self.attribute is None else f"{self.module}.{self.attribute}"

    def load(self) -> Any:
        found = importlib.import_module(self.module)
        for name in () if self.attribute is None else self.attribute.split("."):
            found = getattr(found, name)
        return found


def resolver(home: str, table: dict[str, PrivateSymbol], release: str) -> Any:
    """A module ``__getattr__`` for ``home`` that loads ``table``'s symbols on first use;
    ``release`` names the upstream in messages (``'torch 2.15.0'``)."""
    found: dict[str, Any] = {}

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {home!r} has no attribute {name!r}")
        if name not in found:
            symbol = table[name]
            try:
                found[name] = symbol.load()
            except (ImportError, AttributeError) as e:
                raise PrivateSymbolError(
                    f"{release} has no {symbol.path} ({home}.{name} names it): the upstream moved or "
                    f"removed it; point {home}'s table at its new home ({type(e).__name__}: {e})"
                ) from e
        return found[name]

    return __getattr__
