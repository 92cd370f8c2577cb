"""A rollout worker in its own process seeds its action noise per rank from runner.seed: without
it every rollout process starts from torch's fixed default seed, and every rank of every run
explores with the same noise."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from fleetrl.models.policy import Policy
from fleetrl.plan.load import load_config
from fleetrl.workers.rollout_worker import RolloutWorker

OBS = np.zeros((512, 4), np.float32)


def sampled_actions(monkeypatch, weights: dict, rank: int, seed: int) -> torch.Tensor:
    """What rollout rank `rank` of a run with runner.seed=`seed` samples first, as in a fresh
    worker process (FLEETRL_RANK is how the Ray backend tells it its rank)."""
    monkeypatch.setenv("FLEETRL_RANK", str(rank))
    config = load_config("configs/ppo_cartpole.yaml", [f"runner.seed={seed}"])
    env = gym.make("CartPole-v1")
    worker = RolloutWorker.from_config(config, env.observation_space, env.action_space)
    env.close()
    worker.load_weights(weights)  # as the first weight sync does: the same policy everywhere
    actions, _, _ = worker.infer(OBS)
    return actions


def test_rollout_ranks_draw_distinct_noise_that_follows_the_seed(monkeypatch):
    config = load_config("configs/ppo_cartpole.yaml")
    env = gym.make("CartPole-v1")
    weights = Policy.from_config(config.model, env.observation_space, env.action_space).state_dict()
    env.close()
    with torch.random.fork_rng():
        rank0 = sampled_actions(monkeypatch, weights, rank=0, seed=1)
        rank0_again = sampled_actions(monkeypatch, weights, rank=0, seed=1)
        rank1 = sampled_actions(monkeypatch, weights, rank=1, seed=1)
        other_run = sampled_actions(monkeypatch, weights, rank=0, seed=2)
    assert torch.equal(rank0, rank0_again)
    assert not torch.equal(rank0, rank1)
    assert not torch.equal(rank0, other_run)
