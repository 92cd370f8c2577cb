"""A fourth algorithm plugged in from this module alone: REINFORCE with a learned baseline.

Its config section, its actor (an `ActorBase`), the standard rollout worker and one
`register_algorithm` call are all it takes; nothing in the package names it. The tests train it
through the ordinary `Trainer`, and check that the loader, the validation and the console line
treat it as they treat the built-in algorithms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import gymnasium as gym
import pytest
import torch

from fleetrl.algos.gae import compute_gae
from fleetrl.algos.optim import build_optimizer
from fleetrl.algos.registry import AlgorithmSpec, ConsoleMetric, algorithm_names, algorithm_spec, register_algorithm
from fleetrl.config.constraints import UnitInterval
from fleetrl.config.loader import load_config
from fleetrl.config.schema import AlgorithmConfig, Config
from fleetrl.errors import ConfigError
from fleetrl.metrics_log import read_metrics
from fleetrl.models.policy import Policy
from fleetrl.parallel import state
from fleetrl.parallel.wrap import ddp
from fleetrl.progress import summary_line
from fleetrl.run_dir import LOG_FILE
from fleetrl.runner import Trainer
from fleetrl.trajectory import Trajectory
from fleetrl.workers.actor_base import ActorBase
from fleetrl.workers.rollout_worker import RolloutWorker


@dataclass
class ReinforceConfig(AlgorithmConfig):
    baseline_coef: Annotated[float, UnitInterval] = 0.5  # weight of the baseline's squared error in the loss


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
        logprobs, _, values = self.loss_module(trajectory.obs.flatten(0, 1), trajectory.actions.flatten(0, 1))
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


register_algorithm(
    AlgorithmSpec(
        name="reinforce",
        config=ReinforceConfig,
        actor=ReinforceActor,
        rollout=RolloutWorker,
        console_metrics=(ConsoleMetric("baseline_loss", "baseline", ".3f"),),
    )
)

REINFORCE = ["algorithm.name=reinforce", "env.num_envs=4", "algorithm.num_steps=32"]


@pytest.mark.usefixtures("quiet_fleetrl_logging")
def test_the_plugged_in_algorithm_trains_through_the_trainer(tmp_path):
    config = load_config(
        None,
        [
            *REINFORCE,
            "algorithm.baseline_coef=0.25",
            "runner.total_env_steps=512",
            "runner.tensorboard=false",
            f"runner.run_dir={tmp_path}",
        ],
    )
    assert type(config.algorithm) is ReinforceConfig and config.algorithm.baseline_coef == 0.25
    summary = Trainer(config, live_progress=False).train()
    assert summary["iterations"] == 4  # 512 steps / (32 steps × 4 envs)
    records = read_metrics(summary["run_dir"])
    assert len(records) == 4
    assert all(math.isfinite(r["pg_loss"]) and r["baseline_loss"] > 0 for r in records)
    # the console line (written to train.log too) carries its own metric, as its spec says
    log_lines = (tmp_path.glob(f"*/{LOG_FILE}").__next__()).read_text().splitlines()
    iteration_lines = [line for line in log_lines if "| return(100)" in line]
    assert len(iteration_lines) == 4
    assert f"| baseline {records[-1]['baseline_loss']:.3f}" in iteration_lines[-1]
    assert "| kl " not in iteration_lines[-1]


def test_the_registry_names_it_and_the_loader_builds_its_section():
    assert "reinforce" in algorithm_names()
    assert algorithm_spec("reinforce").actor is ReinforceActor
    record = {"iteration": 3, "global_step": 384, "steps_per_s": 1000.0, "baseline_loss": 1.23456}
    line = summary_line(record, algorithm_spec("reinforce").console_metrics)
    assert line.endswith("| return(100) n/a | baseline 1.235")
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["algorithm.name=reinforc"])
    assert caught.value.key == "algorithm.name" and "did you mean 'reinforce'" in str(caught.value)


@pytest.mark.parametrize("value", [2, -0.5, "high"])
def test_a_bad_value_of_its_own_key_is_a_config_error(value):
    with pytest.raises(ConfigError) as caught:
        load_config(None, [*REINFORCE, f"algorithm.baseline_coef={value}"])
    assert caught.value.key == "algorithm.baseline_coef" and caught.value.value == value


def test_another_algorithms_key_is_an_error_naming_it():
    with pytest.raises(ConfigError) as caught:
        load_config(None, [*REINFORCE, "algorithm.clip_coef=0.1"])
    assert caught.value.key == "algorithm.clip_coef"
    assert "'clip_coef' is a key of ppo and ppg, not of reinforce" in str(caught.value)
    assert "baseline_coef" in caught.value.valid  # its own keys are the valid ones
    # and the other way round: its key is not PPO's
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["algorithm.baseline_coef=0.5"])
    assert "'baseline_coef' is a key of reinforce, not of ppo" in str(caught.value)
