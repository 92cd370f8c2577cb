"""SAC's `algorithm` section (`algorithm.name: sac`, Haarnoja et al. 2018) and the rules on it.

SAC is off-policy with Box actions. Of the common keys it reads num_steps (env steps per env per
iteration), gamma, minibatch_size (the sample of every gradient step, over all actor ranks; any
size: it samples the replay), lr (the default of q_lr and policy_lr), anneal_lr and max_grad_norm
(0: no clipping).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import gymnasium as gym
import numpy as np

from fleetrl.config.constraints import AtLeastOne, NonNegative, Positive, Range, UnitInterval
from fleetrl.config.keys import get
from fleetrl.config.schema import AlgorithmConfig, Config
from fleetrl.errors import ConfigError


@dataclass
class SACConfig(AlgorithmConfig):
    """Soft Actor-Critic's own keys (docs: concepts/algorithms.md, SAC)."""

    buffer_size: Annotated[int, Positive] = 1_000_000
    """Replay capacity in transitions over all actor ranks; each env keeps its newest
    `buffer_size // env.num_envs` (more than one iteration's)."""
    learning_starts: Annotated[int, NonNegative] = 100
    """The first this many global env steps take uniform random actions, and training waits until the
    replay holds this many."""
    update_to_data: Annotated[float, Positive] = 1.0
    """Gradient steps per new global env step: an iteration runs `update_to_data * num_steps *
    env.num_envs` of them over all ranks together (fractions carry over)."""
    tau: Annotated[float, UnitInterval] = 0.005
    """Polyak factor of the target critics: target += tau · (critic − target)."""
    q_lr: Annotated[float, Positive] | None = None
    """Learning rate of the twin critics and of the entropy coefficient (null: `algorithm.lr`)."""
    policy_lr: Annotated[float, Positive] | None = None
    """Learning rate of the actor (null: `algorithm.lr`)."""
    alpha: Annotated[float, Positive] = 1.0
    """Entropy coefficient: its initial value with `autotune`, else fixed."""
    autotune: bool = True
    """Tune `alpha` so that the policy's entropy tracks `target_entropy`."""
    target_entropy: Annotated[float, Range()] | None = None
    """`autotune`'s target entropy (null: minus the action dimension)."""
    policy_frequency: Annotated[int, AtLeastOne] = 1
    """One actor (and alpha) update every this many critic updates."""
    target_network_frequency: Annotated[int, AtLeastOne] = 1
    """One Polyak update of the target critics every this many critic updates."""
    checkpoint_replay_buffer: bool = False
    """Checkpoints also hold every actor rank's replay buffer shard (bigger files; a resume trains on
    the same data instead of refilling)."""
    matmul_dtype: Literal["float32", "bfloat16"] | None = None
    """`bfloat16` runs the hidden-to-hidden layers' matmuls (forward and backward) in bfloat16, faster
    on CPUs with AVX512-BF16/AMX; weights, Adam, losses and the input and output layers stay float32
    (null: float32 throughout)."""


UNSUPPORTED = {  # key: (the value SAC needs, why)
    "model.id": ("mlp", "sac builds its own actor and twin-critic MLPs from model.hidden_sizes and model.activation"),
    "model.action_bins": (None, "sac's actor is a squashed Gaussian"),
    "model.action_chunk": (1, "sac's replay stores one action per env step"),
    "env.normalize_obs": (
        False,
        "the replay buffer would keep observations normalised with statistics that later change",
    ),
    "env.normalize_reward": (False, "the replay buffer would keep rewards scaled by statistics that later change"),
    "actor.strategy": ("ddp", "sac's replicas train with DDP"),
    "actor.micro_batch_size": (None, "sac does not accumulate gradients"),
    "actor.gradient_checkpointing": (False, "sac does not recompute activations"),
    "runner.weight_sync": ("full", "sac's rollout workers load its actor network, not a policy's state"),
    "runner.weight_sync_transport": (
        "ray",
        "sac's rollout workers load its actor network with its warm-up flag, which the collective sync does not carry",
    ),
    "actor.checkpoint_format": ("full", "sac's checkpoints gather its replicas and replay buffer on rank 0"),
}


def validate_sac(config: Config) -> None:
    """The replay holding more than an iteration, and what SAC does not combine with."""
    algo, env = config.algorithm, config.env
    if algo.buffer_size // env.num_envs <= algo.num_steps:
        raise ConfigError(
            "algorithm.buffer_size",
            algo.buffer_size,
            f"more than algorithm.num_steps * env.num_envs = {algo.num_steps * env.num_envs} "
            "(each env keeps buffer_size // env.num_envs transitions, more than one iteration's)",
        )
    for key, (needed, why) in UNSUPPORTED.items():
        if get(config, key) != needed:
            raise ConfigError(key, get(config, key), f"{needed!r} with algorithm.name 'sac'", why)


def check_sac_spaces(config: Config, observation_space: gym.Space, action_space: gym.Space) -> None:
    """A flat Box observation and a 1-D Box action with finite bounds (the tanh-squashed actions
    are mapped onto them)."""
    box = isinstance(action_space, gym.spaces.Box)
    if not (
        box
        and len(action_space.shape) == 1
        and np.all(np.isfinite(action_space.low))
        and np.all(np.isfinite(action_space.high))
    ):
        raise ConfigError(
            "algorithm.name",
            "sac",
            f"an algorithm for env.id {config.env.id!r}, whose action space is {action_space}",
            "sac needs continuous actions: a 1-D Box with finite bounds (the default algorithm takes discrete ones)",
        )
    if not isinstance(observation_space, gym.spaces.Box):
        raise ConfigError(
            "algorithm.name",
            "sac",
            f"an algorithm for env.id {config.env.id!r}, whose observation space is {observation_space}",
            "sac's MLPs need a Box observation space",
        )
