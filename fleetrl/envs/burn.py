"""A stand-in for a CPU-bound simulator: CartPole whose every step also burns `step_cpu_ms` of CPU.

`env.id: fleetrl/BurnCPU-v0` (or `fleetrl.envs.burn:BurnCPU`), `env.kwargs: {step_cpu_ms: 1.0}`.
Where `fleetrl.envs.slow:SlowCartPole` sleeps (wall time, no CPU: a simulator waiting on its GPU),
this one computes: it runs arithmetic, holding the GIL like a simulator written in Python or one
that does not release it, until its thread's CPU clock has advanced by `step_cpu_ms`. The cost is
CPU time, not wall time, so on a loaded host a step takes longer but never does less work; and
several of them in one process cannot overlap, exactly as with a real simulator. That is the case
where distributing env workers pays (benchmarks/scaling/parallel_sim.py).
"""

from __future__ import annotations

import time

import gymnasium as gym

from fleetrl.errors import ConfigError

BURN_ID = "fleetrl/BurnCPU-v0"
# Work between two reads of the thread's CPU clock (one read is a system call of ~0.3 us): ~10 us.
_CHUNK = 200


def burn_cpu(seconds: float) -> int:
    """Compute until this thread has used `seconds` of CPU; returns the rounds of work done."""
    deadline = time.thread_time() + seconds
    rounds, value = 0, 1
    while time.thread_time() < deadline:
        for i in range(_CHUNK):
            value = (value * 1103515245 + i) & 0xFFFFFFFF
        rounds += 1
    return rounds


class BurnCPU(gym.Wrapper):
    def __init__(self, step_cpu_ms: float = 1.0, **kwargs):
        if isinstance(step_cpu_ms, bool) or not isinstance(step_cpu_ms, (int, float)) or not step_cpu_ms >= 0:
            raise ConfigError("env.kwargs.step_cpu_ms", step_cpu_ms, "a number of CPU milliseconds >= 0")
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.step_cpu_s = step_cpu_ms / 1000.0

    def step(self, action):
        burn_cpu(self.step_cpu_s)
        return self.env.step(action)


def register() -> None:
    """Make `fleetrl/BurnCPU-v0` a Gymnasium id (500 steps an episode, as CartPole-v1)."""
    if BURN_ID not in gym.envs.registry:
        gym.register(BURN_ID, entry_point="fleetrl.envs.burn:BurnCPU", max_episode_steps=500)


register()
