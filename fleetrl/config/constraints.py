"""Ranges and checks declared with the types: `num_envs: Annotated[int, Positive] = 8`.

A key's type, its allowed values (`Literal[...]` for choices) and its range or rule stand on the
field itself, so a reader finds what a key accepts in one place, and the loader checks every key
against it before anything starts (`loader.coerce`). Each marker also knows a value it rejects
(`outside()`, `Check.bad`), so a test can walk every key of the schema with a bad value and a key
added later is walked too. Rules that relate several keys live in `plan/rules.py` (or an
algorithm's own validation hook).
"""

from __future__ import annotations

import ipaddress
import math
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Range:
    """The interval a number must lie in; NaN is never in it, infinity only where a bound allows
    it explicitly (`finite=False`). `name` ('positive') leads the message when set."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself excluded
    high_open: bool = False
    finite: bool = True
    name: str = ""

    def admits(self, value: float) -> bool:
        if math.isnan(value) or (self.finite and math.isinf(value)):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))

    def describe(self) -> str:
        """'> 0', '>= 1', 'in [0, 1]', 'in (0, 1]'."""
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return ""

    def expected(self, noun: str) -> str:
        """What is valid, as the error message says it: 'an integer >= 1', 'a positive finite
        number (> 0)', 'a finite number'."""
        unbounded = self.low is None or self.high is None
        words = " ".join(
            filter(None, [self.name, "finite" if self.finite and noun == "number" and unbounded else "", noun])
        )
        article = "an" if words[0] in "aeiou" else "a"
        bounds = self.describe()
        if not bounds:
            return f"{article} {words}"
        return f"{article} {words} ({bounds})" if self.name else f"{article} {words} {bounds}"

    def outside(self) -> float:
        """A value this range rejects (for tests that walk every key)."""
        if self.low is not None:
            return self.low if self.low_open else self.low - 1
        if self.high is not None:
            return self.high if self.high_open else self.high + 1
        return math.nan


@dataclass(frozen=True)
class Check:
    """A rule on a value that a range cannot say (a non-empty list, an IP address): `test(value)`
    is true for valid values; `expected` says what is valid; `bad` is a value of the right type
    that the rule rejects (for tests that walk every key)."""

    test: Callable[[Any], bool]
    expected: str
    bad: Any = field(compare=False)  # may be a dict: not part of the hash


@dataclass(frozen=True)
class Note:
    """Added to the message when the key's value is rejected: the why behind a choice."""

    text: str


def is_ip_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def is_torch_device(value: str) -> bool:
    import torch

    try:
        torch.device(value)
    except (RuntimeError, ValueError):
        return False
    return True


def is_prompt_template(value: str) -> bool:
    """A format string whose only placeholder (if any) is {instruction}."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
    except ValueError:
        return False
    return fields <= {"instruction"}


def is_action_stats(value: dict) -> bool:
    """OpenVLA's statistics: {q01: [...], q99: [...]}, equally long lists of numbers, q99 > q01."""
    low, high = value.get("q01"), value.get("q99")
    if set(value) != {"q01", "q99"} or not (isinstance(low, list) and isinstance(high, list)):
        return False
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in [*low, *high])
    return numbers and len(low) == len(high) > 0 and all(h > q for q, h in zip(low, high))


Positive = Range(0, low_open=True, name="positive")
PositiveOrInf = Range(0, low_open=True, finite=False, name="positive")
NonNegative = Range(0, name="non-negative")
AtLeastOne = Range(1)
UnitInterval = Range(0, 1)
Finite = Range()
IPAddress = Check(is_ip_address, "an IP address such as 127.0.0.1 (not a host name)", "localhost:6379")
PromptTemplate = Check(is_prompt_template, "a template whose only placeholder is {instruction}", "{task}")
ActionStats = Check(
    is_action_stats,
    "{q01: [...], q99: [...]}: equally long lists of numbers, each q99 above its q01",
    {"q01": [1.0], "q99": [0.0]},
)
TorchDevice = Check(is_torch_device, "a torch device such as 'cpu', 'cuda' or 'cuda:1'", "gpu0")
