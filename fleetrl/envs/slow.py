"""A stand-in for a heavy simulator: CartPole whose every step also takes `step_time_s`.

Used by the pipelining benchmark and tests (`env.id: fleetrl.envs.slow:SlowCartPole`). The delay
is a sleep, so it costs wall time but no CPU, like a simulator waiting on its GPU.
"""

from __future__ import annotations

import time

import gymnasium as gym


class SlowCartPole(gym.Wrapper):
    def __init__(self, step_time_s: float = 0.005, **kwargs):
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.step_time_s = step_time_s

    def step(self, action):
        time.sleep(self.step_time_s)
        return self.env.step(action)
