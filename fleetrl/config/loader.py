"""YAML + dotted overrides → a typed `Config`, each key checked against its field.

Every mistake becomes a `ConfigError` naming the dotted key, the bad value and what is valid,
with a 'did you mean' for typos. Nothing here starts any work. The `algorithm` section is parsed
with the dataclass its `name` registers, which `AlgorithmSections` (the registry, from the plan
layer above: plan/load.py) supplies; the rules across sections run there too. The `model` section
is parsed with its kind's dataclass (`model.id`: config/model_sections.py). A key that moved or
went is refused saying what replaced it; a run directory's config saved before it went still
loads (config/retired.py).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Protocol

import yaml

from fleetrl.config.constraints import Check, Note, Range
from fleetrl.config.model_sections import BUILTIN_MODELS, ModelConfig, model_section
from fleetrl.config.redact import redacted
from fleetrl.config.retired import retired_key_hint, upgrade_saved_section
from fleetrl.config.schema import SECTION_TYPES, AlgorithmConfig, Config
from fleetrl.errors import ConfigError, UserError, nearest

DEFAULT_ALGORITHM: str = AlgorithmConfig.name  # `algorithm.name` when the config names none
DEFAULT_MODEL: str = ModelConfig.id  # `model.id` when the config names none


class AlgorithmSections(Protocol):
    """Which dataclass holds `algorithm:` for each `algorithm.name`."""

    def names(self) -> list[str]:
        """Every available algorithm's name."""
        ...

    def section(self, name: str) -> type[AlgorithmConfig]:
        """The section's dataclass of algorithm `name`; a `ConfigError` at 'algorithm.name' naming
        the available ones for any other."""
        ...


def read_config(path: str | Path | None, overrides: list[str] = ()) -> dict:
    """The raw sections: `path`'s YAML (or none when None) with the `key=value` overrides applied."""
    raw = read_yaml(path) if path is not None else {}
    for override in overrides:
        apply_override(raw, override)
    return raw


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise UserError(f"config file {path} is not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise UserError(f"config file {path} must hold a mapping of sections, got {type(raw).__name__}")
    return raw


def apply_override(raw: dict, override: str) -> None:
    """Set `a.b.c=value` in the nested dict; the value is parsed as YAML (so 3e-4, true, [64, 64])."""
    key, sep, text = override.partition("=")
    if not sep or not key:
        raise UserError(f"override {override!r} must look like section.key=value")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError as error:
        raise ConfigError(
            key, text, "a YAML value (quote strings with special characters)", str(error).splitlines()[0]
        ) from None
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        if node.get(part) is None:  # absent, or an empty section (`cluster:` alone in YAML)
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(key, override, "a path through config sections")
    node[parts[-1]] = value


def build_config(raw: dict, algorithms: AlgorithmSections) -> Config:
    unknown = set(raw) - set(SECTION_TYPES)
    for name in sorted(unknown):
        raise ConfigError(name, raw[name], f"one of the sections {sorted(SECTION_TYPES)}", nearest(name, SECTION_TYPES))
    sections = {}
    for name, section_type in SECTION_TYPES.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise ConfigError(name, values, "a mapping of keys")
        values = upgrade_saved_section(name, values)
        if name == "algorithm":  # the section of the algorithm it names
            section_type = algorithms.section(values.get("name", DEFAULT_ALGORITHM))
        if name == "model":  # the section of the kind of model it names
            section_type = model_section(model_id(values))
        sections[name] = build_section(name, section_type, values, algorithms)
    return Config(**sections)


def model_id(values: dict) -> str:
    """`model.id`, checked before the section's other keys: they depend on it."""
    chosen = coerce("model.id", values.get("id", DEFAULT_MODEL), str)
    if chosen not in BUILTIN_MODELS and ":" not in chosen:
        raise ConfigError(
            "model.id",
            chosen,
            f"one of {list(BUILTIN_MODELS)}, or module:attr naming a network class",
            nearest(chosen, BUILTIN_MODELS),
        )
    return chosen


def build_section(prefix: str, section_type: type, values: dict, algorithms: AlgorithmSections | None = None) -> Any:
    """`values` as a `section_type`; `algorithms` names the other algorithms' keys in the
    `algorithm` section's errors."""
    hints = typing.get_type_hints(section_type, include_extras=True)
    names = [f.name for f in dataclasses.fields(section_type)]
    kwargs = {}
    for key, value in values.items():
        dotted = f"{prefix}.{key}"
        if key not in hints:
            raise ConfigError(
                dotted, value, f"one of {names}", unknown_key_hint(prefix, key, names, values, algorithms)
            )
        kwargs[key] = coerce(dotted, value, hints[key])
    return section_type(**kwargs)


def unknown_key_hint(
    prefix: str, key: str, names: list[str], values: dict, algorithms: AlgorithmSections | None
) -> str:
    """'did you mean …'; for an `algorithm` key that other registered algorithms have, which."""
    if prefix == "algorithm" and algorithms is not None:
        owners = [
            name for name in algorithms.names() if key in {f.name for f in dataclasses.fields(algorithms.section(name))}
        ]
        if owners:
            return f"{key!r} is a key of {' and '.join(owners)}, not of {values.get('name', DEFAULT_ALGORITHM)}"
    return retired_key_hint(prefix, key, values) or nearest(key, names)


def coerce(key: str, value: Any, hint: Any) -> Any:
    """Check `value` against the annotation — its type (ints are accepted where floats are
    expected), `Literal` choices, list element types, and the `Range`s and `Check`s of
    `Annotated` (constraints.py) — and return it converted."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        base, *extras = typing.get_args(hint)
        note = " ".join(extra.text for extra in extras if isinstance(extra, Note))
        try:
            value = coerce(key, value, base)
        except ConfigError as error:
            if not note:
                raise
            raise ConfigError(error.key, error.value, error.valid, note) from None
        for extra in extras:
            if isinstance(extra, Range) and not extra.admits(value):
                raise ConfigError(key, value, extra.expected("integer" if base is int else "number"), note)
            if isinstance(extra, Check) and not extra.test(value):
                raise ConfigError(key, value, extra.expected, note)
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        (inner,) = [option for option in options if option is not type(None)]
        try:
            return coerce(key, value, inner)
        except ConfigError as error:
            if error.key != key or type(None) not in options:
                raise
            raise ConfigError(key, error.value, f"{error.valid}, or null", error.hint) from None
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if value not in choices or isinstance(value, bool) != any(isinstance(c, bool) for c in choices):
            raise ConfigError(key, value, f"one of {list(choices)}", nearest(str(value), map(str, choices)))
        return value
    expected = origin or hint
    if dataclasses.is_dataclass(expected) and isinstance(value, dict):  # a nested section (model.lora)
        return build_section(key, expected, value)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is float and isinstance(value, str):
        try:  # YAML reads '3e-4' (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if expected is int and isinstance(value, bool) or not isinstance(value, expected):
        raise ConfigError(key, value, f"a value of type {getattr(expected, '__name__', expected)}")
    if expected is list and typing.get_args(hint):
        (element,) = typing.get_args(hint)
        return [coerce(f"{key}[{index}]", item, element) for index, item in enumerate(value)]
    if expected is dict and typing.get_args(hint):
        names, element = typing.get_args(hint)
        return {
            coerce(f"{key}.{name}", name, names): coerce(f"{key}.{name}", item, element) for name, item in value.items()
        }
    return value


def save_config(config: Config, path: Path) -> None:
    """Write the fully resolved config; `plan.load.load_config(path)` reads it back unchanged, but
    for secrets, which are never written (config/redact.py)."""
    path.write_text(yaml.safe_dump(redacted(dataclasses.asdict(config)), sort_keys=False))
