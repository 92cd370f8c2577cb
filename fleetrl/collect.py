"""Env ⇄ rollout for T steps into a preallocated `Trajectory`.

The loop body is one batched policy forward and one vector-env step: no per-env Python, and
tensors and arrays share memory (`torch.from_numpy`, `.numpy()`) instead of being copied.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from fleetrl.trajectory import Trajectory
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker


class Collector:
    """Writes each step into NumPy buffers (an element assignment costs ~1 µs there, several in
    torch) and hands them to the actor as zero-copy tensors."""

    def __init__(self, env: EnvWorker, rollout: RolloutWorker, steps: int):
        self.env, self.rollout, self.steps = env, rollout, steps
        space, count = env.action_space, env.num_envs
        continuous = isinstance(space, gym.spaces.Box)
        action_shape = space.shape if continuous else ()

        def zeros(*shape, dtype=np.float32):
            return np.zeros((steps, count, *shape), dtype)

        self.buffers = {
            "obs": zeros(*env.observation_space.shape), "logprobs": zeros(), "values": zeros(),
            "actions": zeros(*action_shape, dtype=np.float32 if continuous else np.int64),
            "rewards": zeros(), "terminated": zeros(dtype=bool), "dones": zeros(dtype=bool),
            "next_values": zeros(), "truncated": zeros(dtype=bool), "truncated_values": zeros(),
        }
        self.obs: np.ndarray | None = None

    def start(self, epoch: int = 0) -> None:
        self.obs = self.env.reset(epoch)

    def collect(self) -> Trajectory:
        b = self.buffers
        b["truncated"][:] = False
        for t in range(self.steps):
            obs = self.obs
            actions, logprobs, values = self.rollout.infer(obs)
            actions = actions.numpy()
            step = self.env.step(actions)
            b["obs"][t] = obs
            b["actions"][t] = actions
            b["logprobs"][t] = logprobs.numpy()
            b["values"][t] = values.numpy()
            b["rewards"][t] = step.reward
            b["terminated"][t] = step.terminated
            b["truncated"][t] = step.truncated
            b["dones"][t] = step.terminated | step.truncated
            if len(step.truncated_index):
                b["truncated_values"][t, step.truncated_index] = self.rollout.values(step.final_obs).numpy()
            self.obs = step.obs
        b["next_values"][:-1] = b["values"][1:]
        b["next_values"][-1] = self.rollout.values(self.obs).numpy()
        truncated = b["truncated"]
        b["next_values"][truncated] = b["truncated_values"][truncated]
        return Trajectory(**{name: torch.from_numpy(b[name]) for name in
                             ("obs", "actions", "logprobs", "values", "rewards", "terminated",
                              "dones", "next_values")})
