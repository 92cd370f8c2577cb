"""The actor component: the trainable policy and its optimizer; advantages and PPO updates."""

from __future__ import annotations

import gymnasium as gym
import torch

from fleetrl.algos.gae import compute_gae
from fleetrl.algos.ppo import PPOBatch, ppo_update
from fleetrl.config.schema import Config
from fleetrl.models.policy import Policy
from fleetrl.trajectory import Trajectory


def build_optimizer(config: Config, policy: Policy) -> torch.optim.Optimizer:
    """Adam(W) with the fused kernel: one call for all parameters (2.5× faster than foreach on
    a 64×64 MLP here)."""
    optimizer_class = torch.optim.Adam if config.actor.optimizer == "adam" else torch.optim.AdamW
    return optimizer_class(policy.parameters(), lr=config.algorithm.lr, eps=config.actor.adam_eps,
                           weight_decay=config.actor.weight_decay, fused=True)


class ActorWorker:
    def __init__(self, config: Config, observation_space: gym.Space, action_space: gym.Space):
        self.config = config
        torch.manual_seed(config.runner.seed)  # identical initial weights wherever it is built
        self.policy = Policy.from_config(config.model, observation_space, action_space)
        self.optimizer = build_optimizer(config, self.policy)
        self.generator = torch.Generator().manual_seed(config.runner.seed)

    def schedule(self, progress: float) -> tuple[float, float]:
        """(lr, clip_coef) at `progress` = global env steps / total env steps."""
        algo = self.config.algorithm
        remaining = max(0.0, 1.0 - progress)
        lr = algo.lr * remaining if algo.anneal_lr else algo.lr
        clip = algo.clip_coef * remaining if algo.anneal_clip else algo.clip_coef
        return lr, clip

    def train(self, trajectory: Trajectory, progress: float) -> dict:
        algo = self.config.algorithm
        advantages, returns = compute_gae(trajectory.rewards, trajectory.values, trajectory.next_values,
                                          trajectory.terminated, trajectory.dones,
                                          algo.gamma, algo.gae_lambda)
        batch = PPOBatch(trajectory.obs.flatten(0, 1), trajectory.actions.flatten(0, 1),
                         trajectory.logprobs.flatten(), trajectory.values.flatten(),
                         advantages.flatten(), returns.flatten())
        lr, clip = self.schedule(progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        metrics = ppo_update(self.policy, self.optimizer, batch, algo, clip, self.generator)
        metrics.update(lr=lr, clip_coef=clip, explained_variance=explained_variance(
            trajectory.values.flatten(), returns.flatten()))
        return metrics

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var[target - predicted] / Var[target]: 1 is a perfect value function, ≤ 0 useless."""
    variance = target.var()
    return float("nan") if variance == 0 else float(1 - (target - predicted).var() / variance)
