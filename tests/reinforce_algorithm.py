"""A fourth algorithm defined outside the package: REINFORCE with a learned baseline.

Its config section, its actor (an `ActorBase`), the standard rollout worker and one
`AlgorithmSpec` are all it takes; nothing in the package names it. `SPEC` is what an entry point
in the `fleetrl.algorithms` group names (fleetrl registers it when `algorithm.name` asks for it),
and what tests/test_algorithm_plugin.py registers for the length of each of its tests only: a
module-level registration would make every later test's set of algorithms depend on which
modules pytest collected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import gymnasium as gym
import torch

from fleetrl.algos.common.gae import compute_gae
from fleetrl.algos.common.optim import build_optimizer
from fleetrl.algos.registry import AlgorithmSpec, ConsoleMetric
from fleetrl.config.constraints import UnitInterval
from fleetrl.config.schema import AlgorithmConfig, Config
from fleetrl.models.policy import Policy
from fleetrl.parallel import state
from fleetrl.parallel.wrap import ddp
from fleetrl.trajectory import Trajectory
from fleetrl.workers.actor_base import ActorBase
from fleetrl.workers.rollout_worker import RolloutWorker


@dataclass
class ReinforceConfig(AlgorithmConfig):
    """REINFORCE's own keys."""

    baseline_coef: Annotated[float, UnitInterval] = 0.5
    """Weight of the baseline's squared error in the loss."""


class ReinforceActor(ActorBase):
    """One gradient step per iteration on the whole shard: -log π(a|s)·(G - V(s)) + c·(G - V(s))²,
    with G the discounted return (bootstrapped at the rollout's end)."""

    def __init__(
        self, config: Config, observation_space: gym.Space, action_space: gym.Space, rank: int = 0, world_size: int = 1
    ):
        super().__init__(config, observation_space, action_space, rank, world_size)
        self.policy = Policy.from_config(config.model, observation_space, action_space).to(self.device)
        self.loss_module: torch.nn.Module = self.policy
        self.optimizer = build_optimizer(
            config.actor, [{"params": list(self.policy.parameters()), "lr": config.algorithm.lr}]
        )

    def replicated_modules(self) -> dict:
        return {"policy": self.policy}

    def wrap_for_ranks(self) -> None:
        self.loss_module = ddp(self.policy, self.device)

    def train(self, trajectory: Trajectory, progress: float) -> dict:
        self.require_distributed()
        algo = self.config.algorithm
        _, returns = compute_gae(
            trajectory.rewards,
            trajectory.values,
            trajectory.next_values,
            trajectory.terminated,
            trajectory.dones,
            algo.gamma,
            1.0,  # λ = 1: the discounted return
        )
        logprobs, _, values, _ = self.loss_module(trajectory.obs.flatten(0, 1), trajectory.actions.flatten(0, 1))
        returns = returns.flatten()
        advantages = (returns - values).detach()
        pg_loss = -(logprobs * advantages).mean()
        baseline_loss = (returns - values).pow(2).mean()
        self.optimizer.zero_grad(set_to_none=True)
        (pg_loss + algo.baseline_coef * baseline_loss).backward()
        self.optimizer.step()
        reduced = self.all_reduce(torch.stack([pg_loss.detach(), baseline_loss.detach()])) / self.world_size
        pg, baseline = reduced.tolist()
        return {"pg_loss": pg, "baseline_loss": baseline}

    def policy_weights(self) -> dict:
        return state.model_state(self.policy, False)

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, saved: dict) -> None:
        self.policy.load_state_dict(saved["policy"])
        self.optimizer.load_state_dict(saved["optimizer"])


SPEC = AlgorithmSpec(
    name="reinforce",
    config=ReinforceConfig,
    actor=ReinforceActor,
    rollout=RolloutWorker,
    console_metrics=(ConsoleMetric("baseline_loss", "baseline", ".3f"),),
)
