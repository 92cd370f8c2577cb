"""Envs for the live-view tests (tests/test_live_view.py), importable by Ray workers."""

from __future__ import annotations

import os
import time

from gymnasium.envs.classic_control.cartpole import CartPoleEnv


def simulate_physics(seconds: float) -> None:
    """Where a held step spends its time: the function a stack of the env worker must show."""
    time.sleep(seconds)


class HeldCartPole(CartPoleEnv):
    """CartPole whose every step takes `step_s` while `hold_file` exists, and no time once the
    test removes it: slow while a test looks at the run, then quick to its normal end. With
    `stepped_file`, its first step writes that file: the run's first iteration is under way."""

    def __init__(self, hold_file: str, step_s: float = 0.3, stepped_file: str = "", **kwargs):
        super().__init__(**kwargs)
        self.hold_file, self.step_s, self.stepped_file = hold_file, step_s, stepped_file

    def step(self, action):
        if self.stepped_file and not os.path.exists(self.stepped_file):
            with open(self.stepped_file, "w") as stepped:
                stepped.write(str(os.getpid()))
        if os.path.exists(self.hold_file):
            simulate_physics(self.step_s)
        return super().step(action)
