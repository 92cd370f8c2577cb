"""The one resolve step: a `Config` → a `RunPlan`, every rule that relates keys across sections
checked here, once, before anything starts.

`fleetrl train` and `fleetrl sft` (with `--dry-run` too) and each combination of a sweep resolve
their config once; the supervisor hands the plan to the controller in its orders, the `Trainer`
hands it to the backend, and the backends build their workers from it and check nothing it has
checked. A `Trainer` given a `Config` (a test, a library user) resolves it first.

One rule cannot run before anything starts: the one that needs the env's spaces
(`RunPlan.check_spaces`), known once an env worker is built; the backends run it then, before any
actor is built. What only the live run can tell — the nodes a Ray cluster has, the contents of a
checkpoint — is checked where it is met, and says so with the key it concerns.
"""

from __future__ import annotations

import copy
from typing import Literal

from fleetrl.config.schema import Config
from fleetrl.plan.layout import choose_backend, place
from fleetrl.plan.load import parsed_algorithm
from fleetrl.plan.rules import (
    check_actor_layout,
    check_entry_points,
    check_eval_fault,
    check_fault_placement,
    check_inputs,
    check_stage,
    validate,
)
from fleetrl.plan.run_plan import RunPlan


def resolve(config: Config, command: Literal["train", "sft"] | None = None) -> RunPlan:
    """Check `config` whole and plan its run: the rules across sections, the env and model entry
    points, the algorithm against `command` (`fleetrl train` runs RL algorithms, `fleetrl sft`
    supervised ones; None: either), then the placement and the backend with the rules that need
    them. The first broken rule raises its `ConfigError` (exit 2 on the command line)."""
    config = copy.deepcopy(parsed_algorithm(config))
    validate(config)
    check_inputs(config)
    check_entry_points(config)
    if command is not None:
        check_stage(config, command)
    placement = place(config)
    check_actor_layout(config, placement.world_size("actor"))
    check_eval_fault(config)
    check_fault_placement(config, placement)
    return RunPlan(config, choose_backend(config, placement))
