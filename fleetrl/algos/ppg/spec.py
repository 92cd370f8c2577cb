"""Registers the `ppg` algorithm: PPO's spec with its own section, actor and rules (the rollout
worker and console are PPO's)."""

from __future__ import annotations

from dataclasses import replace

from fleetrl.algos.ppg.config import PPGConfig, check_ppg_layout, check_ppg_spaces, validate_ppg
from fleetrl.algos.ppo.spec import PPO
from fleetrl.algos.registry import register_algorithm

PPG = register_algorithm(
    replace(
        PPO,
        name="ppg",
        config=PPGConfig,
        actor="fleetrl.algos.ppg.actor:PPGActorWorker",
        validate=validate_ppg,
        check_layout=check_ppg_layout,
        check_spaces=check_ppg_spaces,
        asynchronous=False,  # its auxiliary phase would need stale-sample corrections of its own
    )
)
