"""Rewards and observations are finite before anything learns from them (`env.nan_policy`).

The env worker checks every step's rewards, observations and the final observations it will
bootstrap from, as the simulators return them — before the observation and reward normalisers see
them, so a NaN never reaches their running statistics (which a checkpoint keeps). A sum of squares
per step (`values_finite`), element by element only where it is not finite: integer leaves (images,
token ids) are never looked at.

What a non-finite value does is one choice for the run:

- `error` (the default): `NonFiniteError` naming the env (its index in the worker, its stage),
  the key (`reward`, `observation[2]`, `observation['state'][0]`, `final observation[...]`), the
  value, the step of its episode and the worker's env steps. The incident is `non_finite`.
- `zero`: each non-finite value becomes 0, and is counted (`non_finite_replaced`).
- `skip_episode`: the env's episode ends there — its reward 0, the step marked terminated (no
  bootstrap from a broken observation), the env reset when its episode would otherwise go on —
  and the episode counts in no return; counted (`non_finite_skipped`). A reset that answers with a
  non-finite observation again is an error: skipping cannot help a simulator that only gives
  those.

The counts are reported with the env worker's counters (`EnvWorker.report`), in every metrics
record and in summary.json.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from fleetrl.non_finite import NonFiniteError, all_finite, first_non_finite, non_finite_rows
from fleetrl.observations import map_obs, obs_len

log = logging.getLogger("fleetrl")
ERROR, ZERO, SKIP_EPISODE = "error", "zero", "skip_episode"


@dataclass
class Checked:
    """A step's answer once checked: what goes on, and which envs' episodes were skipped."""

    obs: object
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: object  # of the envs still truncated, in env order
    skipped: np.ndarray | None  # (N,) bool, only with skip_episode and a skip in this step


class NanPolicy:
    """`env.nan_policy` over one env worker's stages (module docstring)."""

    def __init__(self, policy: str, stage_size: int):
        self.policy, self.stage_size = policy, stage_size
        self.replaced = 0  # values set to 0 (zero)
        self.skipped = 0  # episodes ended early (skip_episode)

    def step(
        self,
        vector: gym.vector.VectorEnv,
        stage: int,
        obs,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final_obs,
        where: StepPlace,
    ) -> Checked:
        """Check one stage's step; `final_obs`: the final observations of its truncated envs (one
        row each, in `np.flatnonzero(truncated)` order), the ones bootstrapped from."""
        if values_finite(reward, obs, final_obs):
            return Checked(obs, reward, terminated, truncated, final_obs, None)
        leaves = {"reward": reward, **named_leaves("observation", obs), **named_leaves("final observation", final_obs)}
        truncated_index = np.flatnonzero(truncated)
        if self.policy == ERROR:
            raise self.error(leaves, truncated_index, stage, where)
        if self.policy == ZERO:
            for leaf in leaves.values():
                self.replaced += zero_non_finite(leaf)
            self.warn_once(f"non-finite values replaced by 0 (env.nan_policy: zero), {self.replaced} so far")
            return Checked(obs, reward, terminated, truncated, final_obs, None)
        bad = non_finite_rows(reward) | rows_of(obs, len(reward))
        bad[truncated_index] |= rows_of(final_obs, len(truncated_index))
        go_on = bad & ~(terminated | truncated)  # their episode would continue from a broken state
        reward, terminated, truncated = np.where(bad, 0.0, reward), terminated | bad, truncated & ~bad
        if go_on.any():
            obs = self.reset_envs(vector, obs, go_on, stage, where)
        self.skipped += int(bad.sum())
        self.warn_once(f"episodes with non-finite values skipped (env.nan_policy: skip_episode), {self.skipped} so far")
        final_obs = map_obs(lambda x: x[~bad[truncated_index]], final_obs)
        return Checked(obs, reward, terminated, truncated, final_obs, bad)

    def reset(self, vector: gym.vector.VectorEnv, obs, stage: int, where: StepPlace):
        """Check a stage's first observations (a reset); returns them, replaced or re-reset."""
        if finite_leaves(obs):
            return obs
        leaves = named_leaves("observation", obs)
        if self.policy == ERROR:
            raise self.error(leaves, np.zeros(0, np.int64), stage, where)
        if self.policy == ZERO:
            for leaf in leaves.values():
                self.replaced += zero_non_finite(leaf)
            return obs
        bad = rows_of(obs, len(next(iter(leaves.values()))))
        self.skipped += int(bad.sum())
        return self.reset_envs(vector, obs, bad, stage, where)

    def reset_envs(self, vector: gym.vector.VectorEnv, obs, envs: np.ndarray, stage: int, where: StepPlace):
        """`obs` with the rows of `envs` replaced by a fresh reset of those envs; a non-finite
        first observation again is a `NonFiniteError` (skipping cannot help)."""
        fresh, _ = vector.reset(options={"reset_mask": envs})
        obs = map_obs(lambda old, new: np.where(envs.reshape(-1, *[1] * (old.ndim - 1)), new, old), obs, fresh)
        if not finite_leaves(obs):
            leaves = named_leaves("observation after a skip_episode reset", obs)
            raise self.error(leaves, np.zeros(0, np.int64), stage, where)
        return obs

    def error(self, leaves: dict, truncated_index: np.ndarray, stage: int, where: StepPlace) -> NonFiniteError:
        """The first non-finite value, by key in the order checked, named with its env and step."""
        for key, leaf in leaves.items():
            found = first_non_finite(leaf)
            if found is None:
                continue
            index, value = found
            row = int(truncated_index[index[0]]) if key.startswith("final") else index[0]
            element = "".join(f"[{i}]" for i in index[1:])
            what = "env reward" if key == "reward" else "env observation"
            return NonFiniteError(what, f"{key}{element}", value, where.describe(stage * self.stage_size + row, stage))
        raise AssertionError("error() called without a non-finite value")  # pragma: no cover

    def warn_once(self, message: str) -> None:
        if self.replaced + self.skipped == 1 or (self.replaced + self.skipped) in (10, 100, 1000):
            log.warning(message)


@dataclass
class StepPlace:
    """Where an env worker is: its envs' episode lengths and its env steps so far."""

    episode_length: np.ndarray
    env_steps: int

    def describe(self, env: int, stage: int) -> str:
        return (
            f"env {env} of this worker (stage {stage}), step {int(self.episode_length[env]) + 1} of its episode, "
            f"after {self.env_steps} env steps of this worker"
        )


def values_finite(reward: np.ndarray, obs, final_obs) -> bool:
    """A step's rewards, observations and final observations (where any env was truncated) are
    all finite: the check every step pays. Where the observation is one float array and no env was
    truncated (nearly every step), one sum of squares of the rewards and observations (two BLAS dot
    products): finite exactly when every value is, unless large finite values overflow it, and
    only then the arrays are looked at one by one (`fleetrl.non_finite.all_finite`, per array)."""
    if type(obs) is np.ndarray and obs.dtype.kind == "f" and reward.ndim == 1 and not len(final_obs):
        flat = obs.reshape(-1)
        if math.isfinite(np.dot(flat, flat) + np.dot(reward, reward)):
            return True
    return all_finite(reward) and finite_leaves(obs) and (not obs_len(final_obs) or finite_leaves(final_obs))


def finite_leaves(obs) -> bool:
    """Every float leaf of an observation (batch) is finite."""
    if isinstance(obs, dict):
        return all(all_finite(leaf) for leaf in obs.values())
    return all_finite(obs)


def named_leaves(name: str, obs) -> dict[str, np.ndarray]:
    """An observation's float arrays by the key a report names them with."""
    if isinstance(obs, dict):
        return {f"{name}[{key!r}]": value for key, value in obs.items() if value.dtype.kind == "f"}
    return {name: obs} if obs.dtype.kind == "f" else {}


def rows_of(obs, count: int) -> np.ndarray:
    """(count,) bool: the rows of `obs` (any leaf) holding a non-finite value."""
    rows = np.zeros(count, bool)
    for leaf in named_leaves("", obs).values():
        rows |= non_finite_rows(leaf)
    return rows


def zero_non_finite(array: np.ndarray) -> int:
    """Set the non-finite elements of `array` to 0 in place; how many there were."""
    bad = ~np.isfinite(array)
    count = int(bad.sum())
    array[bad] = 0
    return count
