"""A simulator that breaks, mid-run, what it declared — its observation's shape or dtype, its
action space, an info that must cross processes — is named with the env, the key, what was
expected and what came, not a traceback from inside Gymnasium's batcher."""

from __future__ import annotations

import numpy as np
import pytest

from fleetrl.config.schema import EnvConfig
from fleetrl.envs.contract import BadSimulatorData
from fleetrl.workers.env_worker import EnvWorker
from tests.incidents import SMALL
from tests.support import train


def breaking_env(fault: str, vectorization: str = "sync") -> EnvWorker:
    config = EnvConfig(
        id="tests.envs:BreaksItsSpaces", kwargs={"fault": fault, "at": 3}, num_envs=2, vectorization=vectorization
    )
    worker = EnvWorker(config, gamma=0.99, seed=0)
    worker.reset()
    return worker


@pytest.mark.parametrize(
    "fault, vectorization, said",
    [
        ("shape", "sync", "observation: expected shape (4,), received shape (5,)"),
        ("dtype", "sync", "observation: expected dtype float32 (or one that casts to it), received dtype <U1"),
        ("actions", "sync", "action_space: expected Discrete(2), received Discrete(3)"),
        ("info", "async", "info['lock']: expected a value that pickles, received TypeError: cannot pickle"),
    ],
)
def test_a_simulator_that_breaks_its_spaces_is_named_with_the_key_expected_and_received(fault, vectorization, said):
    """On its 3rd step; an action space that changes mid-episode (sync) at that episode's end."""
    worker = breaking_env(fault, vectorization)
    steps = 0
    with pytest.raises(BadSimulatorData) as raised:
        while steps < 500:  # CartPole's episodes end within 500 steps
            worker.step(np.zeros(2, np.int64))
            steps += 1
    assert steps == 2 or fault == "actions", steps
    assert str(raised.value).startswith("env ") and " of this worker answered step with bad data: " in str(raised.value)
    assert said in str(raised.value)
    worker.close()


def test_float64_observations_of_a_float32_space_are_not_bad_data():
    worker = breaking_env("float64")  # a simulator's common habit
    results = [worker.step(np.zeros(2, np.int64)) for _ in range(4)]
    assert results[-1].obs.dtype == np.float32
    worker.close()


def test_bad_data_mid_run_is_an_incident_naming_the_env_rank_key_expected_and_received(tmp_path):
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        "env.id=tests.envs:BreaksItsSpaces",
        "env.kwargs={fault: shape, at: 40}",
        runs=tmp_path,
    )
    report = result.hang_report
    assert result.code == 4 and report is not None, result.stderr[-3000:]
    assert report["cause"] == "worker_exception"
    assert report["summary"].startswith(
        "env rank 0 raised BadSimulatorData in env.step: env 0 of this worker answered step with bad data: "
        "observation: expected shape (4,), received shape (5,)"
    ), report["summary"]
