"""Predicates for values read from users' files and flags, shared by every place that checks one kind of input.

A bool is never a number here (JSON's `true` must not pass as 1), and a float is never an integer (`4.5` heads,
`1e9` layers); numbers must be finite (`NaN` compares false with everything and would slip through ranges).
"""

from __future__ import annotations

import math


def int_in(value: object, lo: int, hi: int) -> bool:
    """An integer from lo to hi (inclusive)."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def number_in(value: object, lo: float, hi: float, *, above_lo: bool = False) -> bool:
    """A finite number from lo (or above it, with above_lo) to hi."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return False
    return (lo < value if above_lo else lo <= value) and value <= hi
