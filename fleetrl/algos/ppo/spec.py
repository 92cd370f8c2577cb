"""Registers the `ppo` algorithm (GRPO included: `algorithm.adv_type: grpo`): its section and
rules from `config`, its workers by reference, so that checking a config imports no torch."""

from __future__ import annotations

from fleetrl.algos.ppo.config import PPOConfig, check_ppo_layout, validate_ppo
from fleetrl.algos.registry import AlgorithmSpec, ConsoleMetric, register_algorithm

PPO = register_algorithm(
    AlgorithmSpec(
        name="ppo",
        config=PPOConfig,
        actor="fleetrl.algos.ppo.actor:ActorWorker",
        rollout="fleetrl.workers.rollout_worker:RolloutWorker",
        validate=validate_ppo,
        check_layout=check_ppo_layout,
        console_metrics=(
            ConsoleMetric("approx_kl", "kl", ".4f"),
            ConsoleMetric("clip_fraction", "clip", ".3f"),
            ConsoleMetric("reference_kl", "ref_kl", ".4f"),  # algorithm.kl_coef > 0 only
        ),
        asynchronous=True,
    )
)
