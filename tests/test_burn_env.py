"""The CPU-bound stand-in simulator (`fleetrl/BurnCPU-v0`): each step costs CPU time, found by
its Gymnasium id and by entry point; bad `step_cpu_ms` is a config error naming the key."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fleetrl.config.schema import EnvConfig
from fleetrl.envs.make import make_vector_env
from fleetrl.errors import ConfigError


def cpu_per_step_s(envs, steps: int) -> float:
    envs.reset(seed=0)
    actions = np.zeros(envs.num_envs, np.int64)
    started = time.process_time()
    for _ in range(steps):
        envs.step(actions)
    return (time.process_time() - started) / (steps * envs.num_envs)


@pytest.mark.parametrize("env_id", ["fleetrl/BurnCPU-v0", "fleetrl.envs.burn:BurnCPU"])
def test_each_step_burns_the_configured_cpu_time(env_id):
    """From the first step on: CPU time, not wall time, so a loaded host cannot make it fail.
    Without the burn a CartPole step costs a few microseconds; 5 ms is three orders above it."""
    envs = make_vector_env(EnvConfig(id=env_id, num_envs=2, kwargs={"step_cpu_ms": 5.0}))
    try:
        assert cpu_per_step_s(envs, steps=1) >= 0.005
        assert cpu_per_step_s(envs, steps=10) >= 0.005
    finally:
        envs.close()


def test_no_burn_is_plain_cartpole_speed():
    """`step_cpu_ms: 0` burns nothing: the same steps cost under a tenth of the 5 ms above."""
    envs = make_vector_env(EnvConfig(id="fleetrl/BurnCPU-v0", num_envs=2, kwargs={"step_cpu_ms": 0}))
    try:
        assert cpu_per_step_s(envs, steps=10) < 0.0005
    finally:
        envs.close()


@pytest.mark.parametrize("value", [-1, "fast", True])
def test_bad_step_cpu_ms_names_the_key(value):
    with pytest.raises(ConfigError, match=r"env\.kwargs\.step_cpu_ms.*" + repr(value).replace("'", ".")):
        make_vector_env(EnvConfig(id="fleetrl/BurnCPU-v0", num_envs=1, kwargs={"step_cpu_ms": value}))


def test_a_mistyped_burn_id_suggests_the_registered_one():
    with pytest.raises(ConfigError, match="did you mean 'fleetrl/BurnCPU-v0'"):
        make_vector_env(EnvConfig(id="fleetrl/BurnCpu-v0", num_envs=1))
