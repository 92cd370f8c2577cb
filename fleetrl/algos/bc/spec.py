"""Registers the `bc` algorithm (the supervised stage, run by `fleetrl sft`): its section, its
workers by reference, and the rule that its demonstrations folder fits the env."""

from __future__ import annotations

from fleetrl.algos.bc.config import BCConfig
from fleetrl.algos.registry import AlgorithmSpec, ConsoleMetric, register_algorithm
from fleetrl.config.schema import Config
from fleetrl.envs import demonstrations


def validate_bc(config: Config) -> None:
    """The demonstrations folder exists and was recorded on this env (`demonstrations.read_index`)."""
    demonstrations.read_index(config.algorithm.demonstrations, config.env)


BC = register_algorithm(
    AlgorithmSpec(
        name="bc",
        config=BCConfig,
        actor="fleetrl.algos.bc.actor:BCActor",
        rollout="fleetrl.workers.rollout_worker:RolloutWorker",
        stage="sft",
        validate=validate_bc,
        console_metrics=(ConsoleMetric("bc_loss", "bc", ".3f"),),
    )
)
