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


def ascii_int(text: str) -> int | None:
    """The integer `text` writes in the digits 0-9 (an optional sign, spaces around), else None. int() alone also
    reads other scripts' digits ('٣' is 3) and underscores, and str.isdigit() passes '²', which int() then rejects:
    every integer read from a user's text or an artifact's key goes through here, so each is refused the same way."""
    body = text.strip()
    digits = body[1:] if body[:1] in ("+", "-") else body
    return int(body) if digits.isascii() and digits.isdigit() else None


def ascii_ints(text: str) -> list[int] | None:
    """A comma-separated list of `ascii_int`s (empty parts skipped), or None if any part is not one."""
    values = [ascii_int(part) for part in text.split(",") if part.strip()]
    return None if any(v is None for v in values) else [v for v in values if v is not None]
