"""The sweep's plan: which trials, with which overrides, needing which resources.

`key=v1,v2,...` sweeps a key over values. Top-level commas separate the values, as in Hydra's
multirun: commas inside [], {} or quotes belong to a value, so `model.hidden_sizes=[64,64],[128,128]`
is two lists and `debug.fault={kind: kill, component: env},{}` two mappings. A key with one value
is a fixed override of every trial. Each value is YAML, read by the same loader as `fleetrl
train`'s overrides, and passed to each trial's `fleetrl train` exactly as typed.

Invariant: `plan_sweep` returns only when every combination loads and resolves its run plan
(plan/resolve.py: every rule `fleetrl train` checks), so a bad key or value in any combination is a config error (exit 2) before any trial, or
Ray, starts.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError, UserError
from fleetrl.plan.layout import worker_processes
from fleetrl.plan.load import load_config, load_unchecked
from fleetrl.plan.resolve import resolve
from fleetrl.plan.run_plan import RunPlan
from fleetrl.sweep.trial import TrialSpec

PER_TRIAL_KEYS = ("runner.run_dir", "runner.name")  # the sweep directory's parent and name: one value


@dataclass(frozen=True)
class SweepPlan:
    config_path: Path  # absolute: trials start in Tune workers
    name: str  # the sweep directory is <runner.run_dir>/sweep-<name>-<time>
    base: Config  # the config with the fixed overrides only
    trials: tuple[TrialSpec, ...]

    def sweep_dir_config(self) -> Config:
        """A config whose run directory (run_dir.create_run_dir) is the sweep directory."""
        return dataclasses.replace(self.base, runner=dataclasses.replace(self.base.runner, name=f"sweep-{self.name}"))


def plan_sweep(config_path: str, overrides: list[str]) -> SweepPlan:
    fixed, grid = parse_grid(overrides)
    base = load_config(config_path, fixed)
    keys = list(grid)
    combinations = list(itertools.product(*grid.values()))
    width = len(str(len(combinations)))
    trials = []
    for index, values in enumerate(combinations, start=1):
        swept = dict(zip(keys, values))
        arguments = (*fixed, *(f"{key}={value}" for key, value in swept.items()))
        plan = check_combination(config_path, list(arguments), swept, len(combinations))
        cpus, gpus = trial_resources(plan)
        trials.append(TrialSpec(index, f"trial-{index:0{width}d}", swept, arguments, cpus, gpus))
    name = base.runner.name or Path(config_path).stem
    return SweepPlan(Path(config_path).resolve(), name, base, tuple(trials))


def parse_grid(overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(fixed overrides, {swept key: its values as typed}), keys in the order given."""
    fixed: list[str] = []
    grid: dict[str, list[str]] = {}
    seen: set[str] = set()
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise UserError(f"override {override!r} must look like section.key=value or section.key=v1,v2")
        if key in seen:
            raise UserError(f"{key} is given twice; list all its values in one {key}=v1,v2")
        seen.add(key)
        if key == "runner.resume":
            raise ConfigError(key, text, "no value in a sweep: each trial starts a new run in the sweep directory")
        values = split_values(key, text)
        if len(values) == 1:
            fixed.append(override)
        elif key in PER_TRIAL_KEYS:
            raise ConfigError(
                key, text, "one value: the sweep directory is <runner.run_dir>/sweep-<runner.name>-<time>"
            )
        else:
            grid[key] = values
    return fixed, grid


def split_values(key: str, text: str) -> list[str]:
    """`1e-3,3e-4` → ['1e-3', '3e-4']; commas inside brackets, braces or quotes stay."""
    values, depth, quote, start = [], 0, None, 0
    for position, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(text[start:position])
            start = position + 1
        if depth < 0:
            break
    values.append(text[start:])
    if quote or depth or (len(values) > 1 and not all(value.strip() for value in values)):
        raise ConfigError(
            key,
            text,
            "YAML values separated by top-level commas (v1,v2; a list value in brackets: [64,64],[128,128])",
            "a bracket or quote is unbalanced, or a value is empty",
        )
    return values


def check_combination(config_path: str, arguments: list[str], swept: dict, count: int) -> RunPlan:
    """Everything `fleetrl train` checks before it starts anything: its run plan."""
    try:
        return resolve(load_unchecked(config_path, arguments), "train")
    except UserError as error:
        if count == 1:
            raise
        where = " ".join(f"{key}={value}" for key, value in swept.items())
        raise UserError(f"{error} (in the combination {where})") from None


def trial_resources(plan: RunPlan) -> tuple[int, int]:
    """(CPUs, GPUs) a trial keeps busy: its controller's torch threads plus, on Ray, each worker
    process's threads (the placement's share of the node), at most the node's CPUs; on a CUDA
    machine, the devices its placement uses."""
    import torch

    config, layout = plan.config, plan.layout
    cores = os.cpu_count() or 1
    cpus = config.runner.torch_threads or cores
    if layout.backend != "inline":
        cpus += sum(process.cpu_threads for process in worker_processes(layout))
    gpus = len({a.device for a in layout.placement.assignments}) if torch.cuda.is_available() else 0
    return min(cpus, cores), gpus
