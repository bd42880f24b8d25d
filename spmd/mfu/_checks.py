"""Argument checks shared by the MFU arithmetic: numbers must be real, finite and in range, counts
whole, so a bad input raises a typed error naming the argument instead of returning nan, 0 or a
negative utilization."""

from __future__ import annotations

import math
import numbers

__all__ = ["count", "real"]


def real(name: str, value: object, *, positive: bool = False) -> float:
    """``value`` as a float: a finite real number, ``> 0`` if ``positive`` else ``>= 0``.

    Raises:
        TypeError: not a real number (a string, a bool, None...).
        ValueError: nan, infinite, negative (or zero when ``positive``).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r:.60}.")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        rule = "finite and > 0" if positive else "finite and >= 0"
        raise ValueError(f"{name} must be {rule}, got {value!r}.")
    return number


def count(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int: a whole number (not a bool) from ``minimum`` to ``maximum`` (inclusive).

    Raises:
        TypeError: not an int.
        ValueError: below ``minimum`` or above ``maximum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.60}.")
    if value < minimum or (maximum is not None and value > maximum):
        rule = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ValueError(f"{name} must be an int {rule}, got {value!r:.60}.")
    return int(value)
