"""Ranges declared with the types: `num_envs: Annotated[int, Positive] = 8`.

A key's type, its allowed values (`Literal[...]` for choices) and its range stand on the field
itself, so a reader finds what a key accepts in one place, and the loader checks every key
against it before anything starts (`loader.coerce`). Rules that relate several keys live in
`validate.py` (or an algorithm's own validation hook).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """The interval a number must lie in; NaN is never in it, infinity only where a bound allows
    it explicitly (`finite=False`)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself excluded
    high_open: bool = False
    finite: bool = True

    def admits(self, value: float) -> bool:
        if math.isnan(value) or (self.finite and math.isinf(value)):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))

    def describe(self) -> str:
        """'> 0', '>= 1', 'in [0, 1]', 'in (0, 1]', as the error message's 'expected a number …'."""
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return "finite" if self.finite else "any number"

    def outside(self) -> float:
        """A value this range rejects (for tests that walk every key)."""
        if self.low is not None:
            return self.low if self.low_open else self.low - 1
        if self.high is not None:
            return self.high if self.high_open else self.high + 1
        return math.nan


Positive = Range(0, low_open=True)
NonNegative = Range(0)
AtLeastOne = Range(1)
UnitInterval = Range(0, 1)
