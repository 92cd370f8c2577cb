"""An env for the sweep tests: CartPole whose first step raises when its first reset was seeded
with `crash_seed` (fleetrl seeds env i with runner.seed + i), so exactly one combination of a
seed × `crash_seed` grid fails — an incident with a hang report — and the others run."""

from __future__ import annotations

from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class CartPoleCrashingOnSeed(CartPoleEnv):
    def __init__(self, crash_seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.crash_seed, self.doomed = crash_seed, False

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.doomed = seed == self.crash_seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.doomed:
            raise RuntimeError(f"this simulator cannot run with seed {self.crash_seed}")
        return super().step(action)
