"""SAC's rollout component: samples the squashed-Gaussian actor (or, while the run warms up,
uniform random actions) and records every step's true next observation for the replay buffer.

It is a `RolloutWorker` with lanes that record `next_obs` (the env worker's final observation on
truncation). Recorded actions are the actor's, in [-1, 1]^d; the env receives them mapped onto
its Box (`action_bias + action_scale · a`: the actor's `to_env`, applied by `env_actions` as for
every policy). Log-probs and values are not needed off-policy and stay zero.

Whether to act at random is decided by the actor from global counters (identical on every
rank): it sets `random_actions` on the actor module it shares with this worker (inline
backend), or sends it with the weights (`SACWeights`) to a worker in its own process.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from fleetrl.algos.sac.learner import SACWeights
from fleetrl.algos.sac.networks import SquashedGaussianActor, build_sac_actor
from fleetrl.config.schema import Config
from fleetrl.step_result import StepResult
from fleetrl.workers.rollout_worker import RolloutWorker, process_rollout_rank, rollout_seed


class SACRolloutWorker(RolloutWorker):
    record_next_obs = True

    def __init__(self, policy: SquashedGaussianActor, generator: torch.Generator | None = None, *, dtype=torch.float32):
        super().__init__(policy, dtype=dtype)
        self.generator = generator  # None: torch's global generator (seeded by the actor inline)

    @classmethod
    def from_config(cls, config: Config, observation_space: gym.Space, action_space: gym.Space):
        """A rollout worker in its own process, with its own copy of the actor."""
        actor = build_sac_actor(config, observation_space, action_space).requires_grad_(False)
        actor.random_actions = config.algorithm.learning_starts > 0
        generator = torch.Generator().manual_seed(rollout_seed(config.runner.seed, process_rollout_rank()))
        return cls(actor, generator)

    def sample(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions in [-1, 1]^d for a batch of observations (uniform while warming up)."""
        if self.policy.random_actions and not deterministic:
            return (torch.rand((len(obs), self.policy.action_dim), generator=self.generator) * 2 - 1).numpy()
        return self.policy.act(self.tensor(obs), deterministic, self.generator).cpu().numpy()

    def infer(self, obs: np.ndarray, deterministic: bool = False):
        """(actions in [-1, 1]^d, zeros, zeros) as CPU tensors: what `fleetrl eval` plays, through
        `env_actions` (the actor's `to_env`) as every rollout worker's."""
        actions = torch.from_numpy(self.sample(obs, deterministic))
        zeros = torch.zeros(len(obs))
        return actions, zeros, zeros

    def configure_lanes(
        self, lane_sizes: list[int], steps: int, observation_space: gym.Space, action_space: gym.Space
    ) -> None:
        super().configure_lanes(lane_sizes, steps, observation_space, action_space)
        self.zeros = {size: np.zeros(size, np.float32) for size in lane_sizes}

    def act(self, lane: int, t: int, step: StepResult) -> np.ndarray | None:
        """Record the outcome of step t-1 (t > 0) and answer step t; at t == T close the lane."""
        buffer = self.lanes[lane]
        zeros = self.zeros[len(step.obs)]
        if t > 0:
            buffer.record_outcome(t - 1, step, zeros[: len(step.truncated_index)])
        if t == buffer.steps:
            self.finished[lane] = buffer.finish(zeros)
            return None
        actions = self.sample(step.obs)
        buffer.record_policy(t, step.obs, actions, zeros, zeros, self.version)
        return self.env_actions(torch.from_numpy(actions)).numpy()

    def load_weights(self, weights: SACWeights | dict) -> None:
        """Weights synced by the actor (`SACWeights`), or an actor state_dict (a checkpoint's
        'policy', for evaluation)."""
        if isinstance(weights, SACWeights):
            self.policy.load_state_dict(weights.actor)
            self.policy.random_actions = weights.random_actions
        else:
            self.policy.load_state_dict(weights)
            self.policy.random_actions = False
