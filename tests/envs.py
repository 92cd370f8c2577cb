"""Deterministic simulators for the tests, reachable as entry points (`tests.envs:CountingEnv`)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class CountingEnv(gym.Env):
    """An env whose episodes the test writes down in advance.

    Sub-env `i` of a vector is told apart by the seed of its first reset (fleetrl seeds env i with
    `seed + i`, so with seed 0 the seed is the index). For sub-env i:
      - an episode lasts `lengths[i % len(lengths)]` steps when `terminal[i % len(terminal)]`
        (then it terminates); otherwise it never ends by itself (only a time limit truncates it);
      - the observation is [i, episode number, steps taken in this episode];
      - the reward of the k-th step of an episode is k (1-based), so an episode of length L
        returns L * (L + 1) / 2.
    The action (Discrete(2)) is ignored.
    """

    metadata = {"render_modes": []}

    def __init__(self, lengths=(3,), terminal=(True,)):
        self.lengths, self.terminal = list(lengths), list(terminal)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.index, self.episode, self.t = 0, -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.index, self.episode = seed, -1
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        terminal = self.terminal[self.index % len(self.terminal)]
        terminated = terminal and self.t >= self.lengths[self.index % len(self.lengths)]
        return self._obs(), float(self.t), terminated, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.index, self.episode, self.t], np.float32)


def obs(index: int, episode: int, t: int) -> list[float]:
    """The observation CountingEnv returns, for readable expectations."""
    return [float(index), float(episode), float(t)]


class FilmedCartPole(CartPoleEnv):
    """CartPole whose `rgb_array` frames need no pygame: a 4 x 16 image whose top row shows the
    steps taken in the episode in binary, so every frame of an episode differs from the last."""

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.t += 1
        return super().step(action)

    def render(self) -> np.ndarray:
        frame = np.zeros((4, 16, 3), np.uint8)
        frame[0, :, :] = 255 * ((self.t >> np.arange(16)) & 1)[:, None]
        return frame


class MetronomeEnv(gym.Env):
    """Episodes of exactly `length` steps, each starting from the same state whatever the seed:
    observation [t / length], reward 1 when the action is t's parity. With `length` equal to
    `algorithm.num_steps`, every iteration starts on a fresh episode, so a resumed run's reset
    (the simulator is not checkpointed) puts the env where the uninterrupted run's is."""

    metadata = {"render_modes": []}

    def __init__(self, length: int = 16):
        self.length, self.t = length, 0
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.t % 2)
        self.t += 1
        return self._obs(), reward, self.t >= self.length, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.t / self.length], np.float32)


class ActionEcho(gym.Env):
    """An env with a lopsided Box action space, (-2, 0) to (2, 4) — its centre (0, 2), its half
    widths (2, 2) — that keeps every action it receives (`received`): a test tells an action
    mapped onto the Box once from one not mapped, or mapped twice. The observation is the step's
    place in the episode, [t / length]; an episode terminates after `length` steps, rewards 0."""

    metadata = {"render_modes": []}

    def __init__(self, length: int = 3):
        self.length, self.t, self.received = length, 0, []
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 4.0], np.float32))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.received.append(np.array(action, np.float32))
        self.t += 1
        return self._obs(), 0.0, self.t >= self.length, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.t / self.length], np.float32)


class NonFiniteAt(CartPoleEnv):
    """CartPole whose sub-env `index` (told apart by the seed of its first reset: seed + i) answers
    its `at`-th step of the run with a non-finite value: `what` = "reward" (NaN), "obs" (NaN in
    element 2 of the observation) or "inf_obs" (+inf there); every other step is CartPole's. With
    `always`, every step of that env from the `at`-th on is non-finite (a simulator that only gives
    those)."""

    def __init__(self, index: int = 1, at: int = 3, what: str = "reward", always: bool = False):
        super().__init__()
        self.target, self.at, self.what, self.always = index, at, what, always
        self.index, self.steps = None, 0

    def reset(self, *, seed=None, options=None):
        if self.index is None and seed is not None:
            self.index = seed
        obs, info = super().reset(seed=seed, options=options)
        return (self.spoil(obs) if self.always and self.steps >= self.at else obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps += 1
        if self.steps == self.at or (self.always and self.steps > self.at):
            if self.what == "reward" and self.index == self.target:
                reward = float("nan")
            obs = self.spoil(obs)
        return obs, reward, terminated, truncated, info

    def spoil(self, obs: np.ndarray) -> np.ndarray:
        if self.index == self.target and self.what in ("obs", "inf_obs"):
            obs = obs.copy()
            obs[2] = np.nan if self.what == "obs" else np.inf
        return obs


class MarksACollection(CartPoleEnv):
    """CartPole that tells a test when a collection has begun. Its `at`-th step writes the file
    `marker`, saying which worker wrote it at which step ("env 0 step 9"; with
    `algorithm.num_steps` N, step N + 1 is the first of the second collection: an env worker
    steps only in collections, every sub-env once per vector step, its resets within that step),
    and from there on each step also sleeps `step_time_s`: the collection that begins at the
    marker lasts num_steps x num_envs x step_time_s, the ones before it cost nothing."""

    def __init__(self, marker: str = "", at: int = 1, step_time_s: float = 0.0):
        super().__init__()
        self.marker, self.at, self.step_time_s, self.steps = Path(marker), at, step_time_s, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at:
            written = self.marker.with_name(f"{self.marker.name}.{os.getpid()}.{id(self)}")
            written.write_text(
                f"{os.environ.get('FLEETRL_COMPONENT')} {os.environ.get('FLEETRL_RANK')} step {self.steps}"
            )
            written.replace(self.marker)  # whole or absent, for a reader in another process
        if self.steps >= self.at:
            time.sleep(self.step_time_s)
        return super().step(action)


class BreaksItsSpaces(CartPoleEnv):
    """CartPole whose `at`-th step breaks what it declared: `fault` = "shape" (a 5-element
    observation), "dtype" (strings), "actions" (its action space becomes Discrete(3)) or "info"
    (an info holding a lock, which cannot be pickled) — or, "float64", only returns float64
    observations for its float32 space, as many simulators do (no fault)."""

    def __init__(self, fault: str = "shape", at: int = 3):
        super().__init__()
        self.fault, self.at, self.steps = fault, at, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps += 1
        if self.steps >= self.at:
            if self.fault == "shape":
                obs = np.zeros(5, np.float32)
            elif self.fault == "dtype":
                obs = np.array(["x"] * 4)
            elif self.fault == "actions":
                self.action_space = gym.spaces.Discrete(3)
            elif self.fault == "info":
                info = {**info, "lock": threading.Lock()}
            elif self.fault == "float64":
                obs = obs.astype(np.float64)
        return obs, reward, terminated, truncated, info
