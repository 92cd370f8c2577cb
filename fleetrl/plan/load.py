"""A config file and `key=value` overrides → a `Config`.

config/loader.py reads the YAML and checks each key against its field; it knows no algorithm,
so the `algorithm` section's dataclass comes from the registry (`SECTIONS`). `load_unchecked`
stops there, for the commands that resolve a run plan next (plan/resolve.py runs every rule
across sections, once); `load_config` also runs the rules that need no placement and checks the
inputs a run would read, for what checks a config without planning a run (`doctor`, a sweep's base,
tests); `load_run_config` runs those rules only, for a finished run's saved config read back
(`fleetrl eval`, `export`). A `Config` built in code holds the common
`AlgorithmConfig` until `parsed_algorithm` gives it its algorithm's own section.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fleetrl.algos.registry import SECTIONS, algorithm_spec
from fleetrl.config.loader import build_config, read_config
from fleetrl.config.schema import Config
from fleetrl.plan.rules import check_inputs, validate


def load_unchecked(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read `path` (or start from defaults when None) and apply `key=value` overrides, each key
    checked against its field; the rules across sections are left to `plan.resolve`."""
    return build_config(read_config(path, overrides), SECTIONS)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """`load_run_config`, then the inputs a run of it would read (`check_inputs`: a supervised
    stage's demonstrations folder)."""
    config = load_run_config(path, overrides)
    check_inputs(config)
    return config


def load_run_config(path: str | Path, overrides: list[str] = ()) -> Config:
    """`load_unchecked`, then the rules across sections that need no placement: for a run's own
    saved config read back (`fleetrl eval`, `export`), which must not fail on what only its
    training read — the demonstrations folder may have moved or been re-recorded since."""
    config = load_unchecked(path, overrides)
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
