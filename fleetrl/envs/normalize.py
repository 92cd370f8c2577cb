"""Running observation and reward normalisation (the statistics are part of every checkpoint)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class RunningMeanStd:
    """Mean and variance of a stream of batches (Chan et al.'s parallel update), in float64."""

    def __init__(self, shape: tuple = ()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, batch: np.ndarray) -> None:
        batch_mean, batch_var, batch_count = batch.mean(0), batch.var(0), batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        self.var = (
            self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        ) / total
        self.count = total

    def state_dict(self) -> dict:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"].copy(), state["var"].copy(), state["count"]


class ObservationNormalizer:
    def __init__(self, shape: tuple, clip: float):
        self.stats, self.clip = RunningMeanStd(shape), clip

    def __call__(self, obs: np.ndarray, update: bool) -> np.ndarray:
        if update:
            self.stats.update(obs)
        scaled = (obs - self.stats.mean) / np.sqrt(self.stats.var + 1e-8)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict:
        return self.stats.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stats.load_state_dict(state)


class DictObservationNormalizer:
    """A Dict observation: one `ObservationNormalizer` per float key; the other keys (images,
    token ids) pass through unchanged."""

    def __init__(self, space: gym.spaces.Dict, clip: float):
        self.by_key = {
            key: ObservationNormalizer(leaf.shape, clip) for key, leaf in space.spaces.items() if is_float(leaf)
        }

    def __call__(self, obs: dict, update: bool) -> dict:
        return {key: self.by_key[key](value, update) if key in self.by_key else value for key, value in obs.items()}

    def state_dict(self) -> dict:
        return {key: normalizer.state_dict() for key, normalizer in self.by_key.items()}

    def load_state_dict(self, state: dict) -> None:
        for key, normalizer in self.by_key.items():
            normalizer.load_state_dict(state[key])


def observation_normalizer(space: gym.Space, clip: float) -> ObservationNormalizer | DictObservationNormalizer | None:
    """`env.normalize_obs` for `space`: running statistics of its float parts; None when it has
    none (an image is never normalised by running statistics)."""
    if isinstance(space, gym.spaces.Dict):
        return DictObservationNormalizer(space, clip)
    return ObservationNormalizer(space.shape, clip) if is_float(space) else None


def is_float(space: gym.Space) -> bool:
    return np.dtype(space.dtype).kind == "f"


class RewardNormalizer:
    """Divides rewards by the running std of the discounted return, as in VecNormalize."""

    def __init__(self, num_envs: int, gamma: float, clip: float):
        self.stats, self.gamma, self.clip = RunningMeanStd(), gamma, clip
        self.discounted_return = np.zeros(num_envs, np.float64)

    def __call__(self, envs: slice, reward: np.ndarray, done: np.ndarray, update: bool) -> np.ndarray:
        """Scale the rewards of the envs `envs` (a pipeline stage's slice of all envs)."""
        if update:
            discounted = self.discounted_return[envs]
            discounted *= self.gamma
            discounted += reward
            self.stats.update(discounted)
            discounted[done] = 0.0
        scaled = reward / np.sqrt(self.stats.var + 1e-8)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)
