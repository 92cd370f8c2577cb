"""User-facing errors.

A `UserError` is a mistake the user can fix (a bad config key, a missing file). The CLI prints its
message without a traceback and exits with code 2, before anything has started.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class UserError(Exception):
    """An error in what the user asked for; printed plainly, exit code 2."""


class ConfigError(UserError):
    """A config value that cannot be used. Names the dotted key, the value and what is valid."""

    def __init__(self, key: str, value: Any, valid: str, hint: str = ""):
        self.key, self.value, self.valid, self.hint = key, value, valid, hint
        message = f"config error at '{key}': got {value!r}; expected {valid}"
        if hint:
            message += f". {hint}"
        super().__init__(message)


def nearest(name: str, candidates: Iterable[str]) -> str:
    """A 'did you mean' sentence for a mistyped name, or '' when nothing is close."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else ""
