"""Typed argument checks, shared by ``mesh``, ``spmd`` and ``fsdp_xla`` (private).

It lives in ``mesh`` because ``mesh`` is the bottom layer: ``spmd`` and ``fsdp_xla`` import it,
never the reverse, so one module serves all three packages. Each ``require_*`` takes the value,
the parameter's name as the message should show it (``"mesh_shape"``, ``"fsdp_config
'min_num_params'"``) and the caller's error class, and raises that class with one message that
names the parameter, shows the value (bounded: a huge list must not make a huge message) and says
what is allowed. Each returns the value normalised (``int(numpy.int64(3)) == 3``).

Python's ``bool`` is an ``int`` subclass, so ``True`` would pass an ``isinstance(x, int)`` check as
``1``: `is_int` and `is_real` are the one place that rule is written.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

__all__ = [
    "is_int",
    "is_real",
    "shown",
    "require_bool",
    "require_int",
    "require_optional_bool",
    "require_real",
    "require_str",
]


def is_int(value: object) -> bool:
    """An integer (Python's or numpy's), not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A real number (int, float, numpy scalar), not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool)


def shown(value: object, limit: int = 60) -> str:
    """``value`` for a message: its repr cut at ``limit`` characters, and its type."""
    return f"{value!r:.{limit}} ({type(value).__name__})"


def _int_rule(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an int from {minimum} to {maximum}"
    if minimum is not None:
        return f"an int >= {minimum}"
    return "an int" if maximum is None else f"an int <= {maximum}"


def require_int(
    value: object,
    name: str,
    error: type[Exception],
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    range_error: type[Exception] | None = None,
    allowed: str | None = None,
) -> int:
    """``value`` as an int from ``minimum`` to ``maximum`` (inclusive, each optional);
    ``allowed`` words the rule when the bounds alone do not say it ("a whole number of devices").

    Raises:
        error: not an int (a bool, a float, a string...).
        range_error (``error`` if not given): out of range.
    """
    rule = allowed or _int_rule(minimum, maximum)
    if not is_int(value):
        raise error(f"{name} must be {rule}, got {shown(value)}.")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):  # type: ignore[operator]
        raise (range_error or error)(f"{name} must be {rule}, got {value!r:.60}.")
    return int(value)  # type: ignore[call-overload]


def require_real(
    value: object,
    name: str,
    error: type[Exception],
    *,
    minimum: float | None = None,
    positive: bool = False,
    range_error: type[Exception] | None = None,
) -> float:
    """``value`` as a finite float, ``> 0`` if ``positive``, ``>= minimum`` if given (nan and inf
    are refused: they would pass a ``<`` check and come out as a nan result).

    Raises:
        error: not a real number.
        range_error (``error`` if not given): nan, infinite or out of range.
    """
    if not is_real(value):
        raise error(f"{name} must be a real number, got {shown(value)}.")
    number = float(value)  # type: ignore[arg-type]
    low = "" if minimum is None else f" and >= {minimum}"
    rule = "finite and > 0" if positive else f"finite{low}"
    if not math.isfinite(number) or (positive and number <= 0) or (minimum is not None and number < minimum):
        raise (range_error or error)(f"{name} must be {rule}, got {value!r:.60}.")
    return number


def require_bool(value: object, name: str, error: type[Exception]) -> bool:
    """``value`` if it is ``True`` or ``False`` (a string such as ``'no'`` is truthy: it would turn
    the option on)."""
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {value!r:.60}.")
    return value


def require_optional_bool(value: object, name: str, error: type[Exception]) -> bool | None:
    """``value`` if it is ``None``, ``True`` or ``False``."""
    if value is not None and not isinstance(value, bool):
        raise error(f"{name} must be True, False or None, got {value!r:.60}.")
    return value


def require_str(value: object, name: str, error: type[Exception], *, nonempty: bool = False) -> str:
    """``value`` if it is a string (non-empty if ``nonempty``)."""
    if not isinstance(value, str) or (nonempty and not value):
        rule = "a non-empty string" if nonempty else "a string"
        raise error(f"{name} must be {rule}, got {shown(value)}.")
    return value
