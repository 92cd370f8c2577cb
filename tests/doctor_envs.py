"""Simulators for the doctor's tests: one whose reset never returns, one whose reset raises."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


class HangingResetEnv(gym.Env):
    """Builds fine, then hangs in reset(), as a simulator waiting for a display or a licence."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        while True:
            time.sleep(3600)

    def step(self, action):
        raise AssertionError("never reached")


class BrokenResetEnv(HangingResetEnv):
    """Fails in reset() with a message the doctor must pass on."""

    def reset(self, *, seed=None, options=None):
        raise RuntimeError("scene asset 'house_living_room.usd' not found")
