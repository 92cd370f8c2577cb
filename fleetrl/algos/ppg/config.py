"""PPG's `algorithm` section (`algorithm.name: ppg`, Cobbe et al. 2020): PPO's keys, which its
policy phase reads, plus the auxiliary phase's; and the rules on them (PPO's first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import gymnasium as gym

from fleetrl.algos.ppo.config import PPOConfig, check_ppo_layout, validate_ppo
from fleetrl.config.constraints import AtLeastOne, NonNegative, Positive
from fleetrl.config.keys import check_split_over_ranks, effective_minibatch_size, minibatch_key
from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError


@dataclass
class PPGConfig(PPOConfig):
    """PPO's keys (its policy phase reads them) plus the auxiliary phase's (docs:
    concepts/algorithms.md, PPG)."""

    n_pi: Annotated[int, AtLeastOne] = 32
    """Policy-phase iterations per auxiliary phase."""
    aux_epochs: Annotated[int, AtLeastOne] = 6
    """Epochs over the stored observations and value targets in each auxiliary phase."""
    aux_minibatch_size: Annotated[int, Positive] | None = None
    """Samples per auxiliary optimizer step over all actor ranks (null: the policy phase's
    minibatch)."""
    beta_clone: Annotated[float, NonNegative] = 1.0
    """Weight of the behavioural-cloning KL(π_old ‖ π) in the auxiliary loss."""


def aux_minibatch_size(config: Config) -> int:
    """Samples per auxiliary-phase optimizer step, over all actor ranks."""
    return config.algorithm.aux_minibatch_size or effective_minibatch_size(config)


def validate_ppg(config: Config) -> None:
    algo, model = config.algorithm, config.model
    if algo.kl_coef > 0:  # PPO's key, read by PPO's update alone: refused, never silently dropped
        raise ConfigError(
            "algorithm.kl_coef",
            algo.kl_coef,
            "0.0 with algorithm.name ppg (or algorithm.name ppo)",
            "PPG's actor keeps no reference policy, and its auxiliary phase has a KL of its own "
            "(algorithm.beta_clone, to the policy before the phase)",
        )
    validate_ppo(config)
    if algo.adv_type == "vtrace" or algo.off_policy_correction == "decoupled":
        key = "algorithm.adv_type" if algo.adv_type == "vtrace" else "algorithm.off_policy_correction"
        raise ConfigError(
            key,
            algo.adv_type if algo.adv_type == "vtrace" else "decoupled",
            "'gae' and 'auto' or 'none' with algorithm.name ppg",
            "PPG's auxiliary phase has no correction for samples an older policy acted",
        )
    if model.id in ("transformer", "hf"):
        raise ConfigError(
            "model.id",
            model.id,
            "'mlp' or a network of your own with algorithm.name ppg",
            "PPG's auxiliary value head reads the policy features, which only those expose "
            "(forward_features; docs: guides/model.md)",
        )
    if config.actor.strategy != "ddp":
        raise ConfigError(
            "actor.strategy",
            config.actor.strategy,
            "'ddp' with algorithm.name ppg",
            "PPG's two phases are wrapped per phase with DDP; FSDP is not supported",
        )
    if config.actor.checkpoint_format != "full":
        raise ConfigError(
            "actor.checkpoint_format",
            config.actor.checkpoint_format,
            "'full' with algorithm.name ppg",
            "PPG's checkpoints hold its auxiliary phase's stored data, gathered on rank 0",
        )
    if model.action_chunk > 1:
        raise ConfigError(
            "model.action_chunk",
            model.action_chunk,
            "1 with algorithm.name ppg",
            "PPG's auxiliary KL compares whole actions; chunks would need it per executed action",
        )
    aux = aux_minibatch_size(config)
    stored = algo.n_pi * config.batch_size
    key = "algorithm.aux_minibatch_size" if algo.aux_minibatch_size is not None else minibatch_key(config)
    if aux <= 0 or stored % aux:
        raise ConfigError(
            key,
            aux,
            f"a positive divisor of the auxiliary phase's data algorithm.n_pi * num_steps * num_envs = {stored}",
        )
    micro = config.actor.micro_batch_size
    if micro is not None and aux % micro:
        raise ConfigError("actor.micro_batch_size", micro, f"a divisor of the auxiliary minibatch {aux}")


def check_ppg_layout(config: Config, world: int) -> None:
    """PPO's, and the auxiliary minibatch split over the ranks."""
    check_ppo_layout(config, world)
    check_split_over_ranks(
        config, "algorithm.aux_minibatch_size", aux_minibatch_size(config), world, "auxiliary minibatch"
    )


def check_ppg_spaces(config: Config, observation_space, action_space) -> None:
    """PPG stores its observations for the auxiliary phase as one tensor: a Box observation."""
    if isinstance(observation_space, gym.spaces.Dict):
        raise ConfigError(
            "algorithm.name",
            "ppg",
            f"an algorithm for env.id {config.env.id!r}, whose observation is a Dict",
            "ppg's auxiliary phase stores Box observations only; ppo trains on Dict observations",
        )
