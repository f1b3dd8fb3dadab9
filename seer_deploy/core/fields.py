"""Typed reads of a JSON artifact's fields (an export's manifest.json, an engine's engine.json): a missing key, a value
of the wrong type or out of range is one ArtifactError naming the file, the key and the fix, never a TypeError or a
ValueError from deep inside a backend (an "internal error" for something the user can repair)."""

from __future__ import annotations

import math
from typing import Any

from seer_deploy.core.checks import int_in, number_in
from seer_deploy.core.errors import ArtifactError

WIDE = 1 << 62  # the default bound of an integer field: anything a JSON file can hold and a range check can compare


class FieldReader:
    """Field access for one file (`where`), each refusal ending with `fix` ('re-export the model')."""

    def __init__(self, where: str, fix: str) -> None:
        self.where, self.fix = where, fix

    def refuse(self, message: str) -> ArtifactError:
        return ArtifactError(f"{self.where}: {message}; {self.fix}")

    def _get(self, obj: dict[str, Any], key: str, label: str | None, kind: type | tuple[type, ...], what: str) -> Any:
        label = label or key
        if key not in obj:
            raise self.refuse(f"'{label}' is missing")
        value = obj[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.refuse(f"'{label}' must be {what}, got {value!r}")
        return value

    def obj(self, obj: dict[str, Any], key: str, label: str | None = None) -> dict[str, Any]:
        return self._get(obj, key, label, dict, "an object")  # type: ignore[no-any-return]

    def array(self, obj: dict[str, Any], key: str, label: str | None = None) -> list[Any]:
        return self._get(obj, key, label, list, "a list")  # type: ignore[no-any-return]

    def string(self, obj: dict[str, Any], key: str, label: str | None = None) -> str:
        return self._get(obj, key, label, str, "a string")  # type: ignore[no-any-return]

    def integer(self, obj: dict[str, Any], key: str, label: str | None = None, *, lo: int = -WIDE,
                hi: int = WIDE) -> int:
        value: int = self._get(obj, key, label, int, "an integer")
        if not int_in(value, lo, hi):
            raise self.refuse(f"'{label or key}' is {value}; it must lie in {lo}..{hi}")
        return value

    def number(self, obj: dict[str, Any], key: str, label: str | None = None) -> float:
        """A finite number above 0 (every number a manifest holds is a threshold)."""
        value = self._get(obj, key, label, (int, float), "a number")
        if not number_in(value, 0.0, math.inf, above_lo=True):
            raise self.refuse(f"'{label or key}' is {value!r}; it must be a number above 0")
        return float(value)

    def integers(self, obj: dict[str, Any], key: str, label: str | None = None, *, lo: int = -WIDE,
                 hi: int = WIDE) -> tuple[int, ...]:
        """A list of integers, each from lo to hi."""
        values = self.array(obj, key, label)
        if not all(int_in(v, lo, hi) for v in values):
            raise self.refuse(f"'{label or key}' is {values!r}; it must be a list of integers in {lo}..{hi}")
        return tuple(values)

    def strings(self, obj: dict[str, Any], key: str, label: str | None = None) -> dict[str, str]:
        """An object whose values are all strings."""
        table = self.obj(obj, key, label)
        bad = next((k for k, v in table.items() if not isinstance(v, str)), None)
        if bad is not None:
            raise self.refuse(f"'{label or key}.{bad}' must be a string, got {table[bad]!r}")
        return dict(table)

    def index(self, text: str, label: str, *, hi: int = WIDE) -> int:
        """A whole number written as ASCII digits (a JSON object's key): str.isdigit() alone also passes '²' and
        other Unicode digits, which int() then rejects or reads differently."""
        if not (text.isascii() and text.isdigit()) or int(text) > hi:
            raise self.refuse(f"'{label}' has the key {text!r} where a whole number 0..{hi} written in ASCII digits "
                              "belongs")
        return int(text)
