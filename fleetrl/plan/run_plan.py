"""The checked plan of one run, as `plan.resolve` makes it and the controller, the backends and the
workers take it: its config, where each rank runs, its algorithm's spec.

Light on purpose: the controller unpickles its plan (the supervisor's orders) in its first
instant, before it has started Ray's daemons or imported torch, so this module imports neither
the rules nor an algorithm; the spec is looked up by name when first asked for, as every worker
process finds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetrl.algos.registry import AlgorithmSpec, algorithm_spec
from fleetrl.config.schema import Config
from fleetrl.plan.layout import Layout
from fleetrl.plan.placement import Placement


@dataclass(frozen=True)
class RunPlan:
    """A run as it will start, every rule passed (`plan.resolve`). Frozen, and its config a copy of
    the one resolved: what was checked is what runs."""

    config: Config  # with its algorithm's own `algorithm` section
    layout: Layout  # the placement and the backend

    @property
    def placement(self) -> Placement:
        return self.layout.placement

    @property
    def spec(self) -> AlgorithmSpec:
        """The algorithm's registered spec: its workers, its console metrics."""
        return algorithm_spec(self.config.algorithm.name)

    def check_spaces(self, observation_space, action_space) -> None:
        """The rules that need the env's spaces (the algorithm's, the model's), the one check a
        plan cannot run before anything starts: the backends run it as soon as env rank 0 has
        answered, before any actor is built."""
        from fleetrl.plan.rules import check_spaces  # the rules import torch: not at unpickling

        check_spaces(self.config, observation_space, action_space)
