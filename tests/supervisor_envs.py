"""Simulators for tests/test_supervisor.py, reachable as entry points (`tests.supervisor_envs:...`).

`NativeFreeze` calls a C function that never returns while holding the GIL (`ctypes.PyDLL`
keeps it, as a C/C++ physics engine's binding does), in its constructor or at its first step;
`CrashOnce` raises at a fixed step of the first run only (a marker file remembers it crashed);
`Segfaulting` reads address 0 at its `at_step`-th step on one env rank (a simulator's crash)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from gymnasium.envs.classic_control.cartpole import CartPoleEnv


def native_call_that_never_returns() -> None:
    ctypes.PyDLL(None).sleep(3600)  # libc sleep() with the GIL held: no Python thread of this process runs


class NativeFreeze(CartPoleEnv):
    def __init__(self, freeze_in: str = "step", **kwargs):
        super().__init__(**kwargs)
        self.freeze_in = freeze_in
        if freeze_in == "init":
            native_call_that_never_returns()

    def step(self, action):
        if self.freeze_in == "step":
            native_call_that_never_returns()
        return super().step(action)


class CrashOnce(CartPoleEnv):
    def __init__(self, marker: str = "", at_step: int = 100, **kwargs):
        super().__init__(**kwargs)
        self.marker, self.at_step, self.steps = Path(marker), at_step, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at_step and not self.marker.exists():
            self.marker.write_text("crashed")
            raise RuntimeError("the simulator crashed")
        return super().step(action)


class Segfaulting(CartPoleEnv):
    def __init__(self, at_step: int = 20, on_rank: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.at_step, self.steps = at_step, 0
        self.crashes = os.environ.get("FLEETRL_COMPONENT") == "env" and os.environ.get("FLEETRL_RANK") == str(on_rank)

    def step(self, action):
        self.steps += 1
        if self.crashes and self.steps == self.at_step:
            ctypes.string_at(0)  # SIGSEGV: faulthandler writes this frame to the worker's stderr
        return super().step(action)


class BrokenIn(CartPoleEnv):
    """CartPole whose constructor raises in the processes of one component (`FLEETRL_COMPONENT`,
    set in every Ray worker): the eval worker's start-up fails while the training envs build."""

    def __init__(self, component: str = "eval", **kwargs):
        if os.environ.get("FLEETRL_COMPONENT") == component:
            raise RuntimeError(f"this simulator cannot start in the {component} worker")
        super().__init__(**kwargs)
