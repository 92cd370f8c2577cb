"""The data types of a rollout: the batch that flows from env ⇄ rollout to the actor
(`Trajectory`: (T, N) tensors), and the buffer that records it step by step from the env's
outcomes (`StepResult`: step_result.py, torch-free for the env worker). They live here, not with
any worker, so that rollout, actor and collector share them without importing each other.

The buffer writes into NumPy arrays (an element assignment costs ~1 µs there, several in torch)
and hands them out as zero-copy tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial

import gymnasium as gym
import numpy as np
import torch

from fleetrl.observations import Observation, map_obs
from fleetrl.observations import zeros as obs_zeros
from fleetrl.step_result import StepResult


@dataclass
class Trajectory:
    obs: Observation  # (T, N, *obs_shape) tensor, or a dict of them (fleetrl.observations)
    actions: torch.Tensor  # (T, N) long, or (T, N, action_dim) float; with chunks (T, N, K, ...)
    logprobs: torch.Tensor  # (T, N); per token (T, N, D) for token policies; with chunks (T, N, K[, D])
    values: torch.Tensor  # (T, N)
    rewards: torch.Tensor  # (T, N)
    terminated: torch.Tensor  # (T, N) bool
    dones: torch.Tensor  # (T, N) bool: terminated or truncated
    next_values: torch.Tensor  # (T, N) V(true next state), final obs on truncation
    # (T, N, *obs_shape) the true next observation: the final one on truncation. Recorded only by
    # buffers made with record_next_obs=True (off-policy algorithms); None otherwise.
    next_obs: Observation | None = None
    # (T, N) int64 env steps each decision executed: an action chunk's k ≤ K, fewer where the
    # episode ended inside it (GAE discounts its bootstrap by γ^k; the loss masks the actions
    # never executed). None without chunks: one env step per decision.
    steps: torch.Tensor | None = None
    # (T, N) float Σ_j r_j over each decision's executed env steps, raw and undiscounted: with
    # chunks the episode return is their sum (for episode-level advantages), not the sum of `rewards` (each Σ_j γ^j r_j).
    # None without chunks.
    chunk_returns: torch.Tensor | None = None
    # (T, N) int64 the policy version that acted each decision: the updates the actor had applied
    # to the weights the rollout held (docs/concepts/async.md). None where no rollout recorded it.
    versions: torch.Tensor | None = None
    # (T, N) int64 each decision's age when trained: the actor's version at the start of the update
    # that trains it minus `versions`. Set by the asynchronous controller when it submits the update
    # (controller/async_updates.py); None elsewhere.
    ages: torch.Tensor | None = None

    @classmethod
    def concatenate(cls, parts: list[Trajectory]) -> Trajectory:
        """Join trajectories of disjoint env sets along the env axis, in the order given."""
        if len(parts) == 1:
            return parts[0]
        return cls(
            **{
                f.name: None
                if getattr(parts[0], f.name) is None
                else map_obs(lambda *columns: torch.cat(columns, dim=1), *(getattr(p, f.name) for p in parts))
                for f in fields(cls)
            }
        )

    def shard(self, rank: int, world_size: int) -> Trajectory:
        """The env columns that actor rank `rank` of `world_size` trains on. With several ranks
        each shard is a copy: a view would carry the whole trajectory when sent to a process."""
        if world_size == 1:
            return self
        per_rank = self.rewards.shape[1] // world_size
        envs = slice(rank * per_rank, (rank + 1) * per_rank)
        return Trajectory(
            **{
                f.name: None
                if getattr(self, f.name) is None
                else map_obs(lambda x: x[:, envs].clone(), getattr(self, f.name))
                for f in fields(self)
            }
        )


class TrajectoryBuffer:
    """Records T steps of N envs: the policy's outputs at step t, then the env's outcome.
    With `record_next_obs` it also keeps every step's true next observation (`next_obs`), with
    `record_steps` the env steps each decision executed (action chunks: `steps`)."""

    def __init__(
        self,
        steps: int,
        num_envs: int,
        observation_space: gym.Space,
        action_shape: tuple,
        action_dtype: np.dtype,
        logprob_shape: tuple = (),
        record_next_obs: bool = False,
        record_steps: bool = False,
    ):
        def zeros(*shape, dtype=np.float32):
            return np.zeros((steps, num_envs, *shape), dtype)

        self.steps = steps
        self.arrays = {
            "obs": obs_zeros(observation_space, (steps, num_envs)),
            "actions": zeros(*action_shape, dtype=action_dtype),
            "logprobs": zeros(*logprob_shape),
            "values": zeros(),
            "rewards": zeros(),
            "terminated": zeros(dtype=bool),
            "dones": zeros(dtype=bool),
            "next_values": zeros(),
            "versions": zeros(dtype=np.int64),
        }
        self.truncated = zeros(dtype=bool)
        self.truncated_values = zeros()
        if record_steps:  # action chunks: env steps executed per decision, and their raw reward
            self.arrays["steps"] = zeros(dtype=np.int64)
            self.arrays["chunk_returns"] = zeros()
        self.next_obs = None
        if record_next_obs:
            self.next_obs = self.arrays["next_obs"] = obs_zeros(observation_space, (steps, num_envs))

    def record_policy(
        self,
        t: int,
        obs: Observation,
        actions: np.ndarray,
        logprobs: np.ndarray,
        values: np.ndarray,
        version: int = 0,
    ) -> None:
        """The policy's answer to step t, from weights of policy `version`."""
        a = self.arrays
        map_obs(partial(assign, t), a["obs"], obs)
        a["actions"][t], a["logprobs"][t], a["values"][t] = actions, logprobs, values
        a["versions"][t] = version
        self.truncated[t] = False

    def record_outcome(self, t: int, step: StepResult, final_values: np.ndarray) -> None:
        """The env's answer to step t; `final_values` = V(final obs) of the truncated envs."""
        a = self.arrays
        a["rewards"][t] = step.reward
        a["terminated"][t] = step.terminated
        a["dones"][t] = step.terminated | step.truncated
        self.truncated[t] = step.truncated
        if step.steps is not None:
            a["steps"][t] = step.steps
            a["chunk_returns"][t] = step.chunk_return
        if len(step.truncated_index):
            self.truncated_values[t, step.truncated_index] = final_values
        if self.next_obs is not None:  # step.obs starts the next episode where one ended
            map_obs(partial(assign, t), self.next_obs, step.obs)
            if len(step.truncated_index):
                map_obs(partial(assign, (t, step.truncated_index)), self.next_obs, step.final_obs)

    def finish(self, last_values: np.ndarray) -> Trajectory:
        """Fill next_values (bootstrapping truncations from their final obs) and hand out tensors."""
        a = self.arrays
        a["next_values"][:-1] = a["values"][1:]
        a["next_values"][-1] = last_values
        a["next_values"][self.truncated] = self.truncated_values[self.truncated]
        return Trajectory(**{name: map_obs(torch.from_numpy, array) for name, array in a.items()})


def assign(index, target: np.ndarray, value: np.ndarray) -> None:
    target[index] = value
