"""`module:attr` entry points, the way users plug in their own simulators and networks."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from fleetrl.errors import ConfigError, nearest


def resolve_entry_point(key: str, spec: str) -> Callable:
    """Import `module:attr` (dots allowed in attr); a ConfigError names what is missing."""
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise ConfigError(key, spec, "'module:attr', e.g. 'my_pkg.sims:MySim'")
    try:
        target = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(key, spec, "an importable module", f"import failed: {error}") from None
    for part in attr_path.split("."):
        if not hasattr(target, part):
            names = [name for name in dir(target) if not name.startswith("_")]
            raise ConfigError(key, spec, f"an attribute of {module_name}", nearest(part, names))
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(key, spec, "a callable (class or function)")
    return target


def check_keyword_arguments(key: str, target: Callable, kwargs: dict, allowed: tuple = ()) -> None:
    """Fail now, by name, if `target` cannot take these keyword arguments (no construction)."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    accepted = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    for name in kwargs:
        if name not in accepted and name not in allowed:
            raise ConfigError(
                f"{key}.{name}", kwargs[name], f"one of {sorted({*accepted, *allowed})}", nearest(name, accepted)
            )
