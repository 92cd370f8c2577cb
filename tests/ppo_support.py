"""A PPO actor on CartPole's spaces and a trajectory its own policy acted: what the tests of the
actor's update (off-policy corrections, the KL to the reference) train on in process."""

from __future__ import annotations

import gymnasium as gym
import torch

from fleetrl.algos.ppo.actor import ActorWorker
from fleetrl.plan.load import load_config
from fleetrl.trajectory import Trajectory
from tests.support import REPO


def cartpole_actor(*overrides: str) -> ActorWorker:
    config = load_config(
        REPO / "configs/ppo_cartpole.yaml",
        ["env.num_envs=4", "algorithm.num_steps=8", "algorithm.minibatch_size=16", *overrides],
    )
    env = gym.make("CartPole-v1")
    return ActorWorker(config, env.observation_space, env.action_space)


def acted_trajectory(actor: ActorWorker) -> Trajectory:
    """8 steps × 4 envs acted by `actor`'s own policy (on-policy), with an episode end."""
    generator = torch.Generator().manual_seed(1)
    obs = torch.randn(8, 4, 4, generator=generator)
    with torch.no_grad():
        actions, logprobs, values = actor.policy.act(obs.flatten(0, 1))
    dones = torch.zeros(8, 4, dtype=torch.bool)
    dones[3, 1] = True
    return Trajectory(
        obs=obs,
        actions=actions.reshape(8, 4),
        logprobs=logprobs.reshape(8, 4),
        values=values.reshape(8, 4),
        rewards=torch.ones(8, 4),
        terminated=dones.clone(),
        dones=dones,
        next_values=torch.cat([values.reshape(8, 4)[1:], torch.zeros(1, 4)]),
    )
