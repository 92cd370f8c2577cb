"""Registers the `sac` algorithm: its section and rules from `config`, its workers by reference."""

from __future__ import annotations

from fleetrl.algos.registry import AlgorithmSpec, ConsoleMetric, register_algorithm
from fleetrl.algos.sac.config import SACConfig, check_sac_spaces, validate_sac

SAC = register_algorithm(
    AlgorithmSpec(
        name="sac",
        config=SACConfig,
        actor="fleetrl.algos.sac.actor:SACActorWorker",
        rollout="fleetrl.algos.sac.rollout:SACRolloutWorker",
        validate=validate_sac,
        check_spaces=check_sac_spaces,
        console_metrics=(ConsoleMetric("q_loss", "q loss", ".3f"), ConsoleMetric("alpha", "alpha", ".3f")),
    )
)
