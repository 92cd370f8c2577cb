"""A config file and `key=value` overrides → a `Config` every rule has passed, ready to plan.

config/loader.py reads the YAML and checks each key against its field; it knows no algorithm,
so the `algorithm` section's dataclass comes from the registry (`SECTIONS`); then the rules
across sections run (plan/rules.py). A `Config` built in code holds the common `AlgorithmConfig`
until `parsed_algorithm` gives it its algorithm's own section.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fleetrl.algos.registry import SECTIONS, algorithm_spec
from fleetrl.config.loader import build_config, read_config
from fleetrl.config.schema import Config
from fleetrl.plan.rules import validate


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read `path` (or start from defaults when None), apply `key=value` overrides, validate."""
    config = build_config(read_config(path, overrides), SECTIONS)
    validate(config)
    return config


def parsed_algorithm(config: Config) -> Config:
    """`config` with its `algorithm` section as the dataclass its algorithm registers (its own
    keys at their defaults where the section was the common one)."""
    section = algorithm_spec(config.algorithm.name).config
    if type(config.algorithm) is section:
        return config
    common = {field.name: getattr(config.algorithm, field.name) for field in dataclasses.fields(config.algorithm)}
    return dataclasses.replace(config, algorithm=section(**common))
