"""A call that waits on its own subprocesses is judged by what they do (probe/child_activity.py):
an async vector env (`env.vectorization: async`, gymnasium's AsyncVectorEnv, spawned
subprocesses) whose envs compute in their constructors past the start-up allowance — the slow
robot simulator's scene load — is busy and finishes; one whose envs block there (no CPU) is still
a `startup_timeout`, and the report says its subprocesses are not computing. Real subprocesses,
real runs, short bounds."""

from __future__ import annotations

from tests.incidents import SMALL, assert_incident, promised_detection_s
from tests.support import train

ASYNC_TWO_ENVS = ["env.vectorization=async", "env.num_envs=2", "runner.total_env_steps=64"]


def test_an_async_env_whose_subprocesses_compute_past_the_startup_allowance_finishes(tmp_path):
    busy_s = 6  # CPU seconds in each subprocess's constructor, past the 3 s allowance
    result = train(
        "configs/ppo_cartpole.yaml",
        *[o for o in SMALL if not o.startswith("runner.total_env_steps")],
        *ASYNC_TWO_ENVS,
        "env.id=tests.watchdog_envs:Computing",
        f"env.kwargs={{busy_s: {busy_s}, in_constructor: true, subprocesses_only: true}}",
        "watchdog.startup_step_allowance_s=3",
        runs=tmp_path,
        timeout=3 * busy_s + 180,  # Computing gives up after 3 * busy_s of wall time
    ).succeeded()
    slow = [line for line in result.stderr.splitlines() if "slow: inline rank 0 has been in env.construct" in line]
    assert len(slow) == 1, result.stderr[-3000:]
    assert "but is busy" in slow[0] and "waiting on its 2 subprocesses, which are computing" in slow[0], slow[0]


def test_an_async_env_whose_subprocesses_block_in_their_constructors_is_a_startup_timeout(tmp_path):
    allowance_s = 5
    result = train(
        "configs/ppo_cartpole.yaml",
        *SMALL,
        *ASYNC_TWO_ENVS,
        "env.id=tests.watchdog_envs:HangingConstructor",
        "env.kwargs={subprocesses_only: true}",
        f"watchdog.startup_step_allowance_s={allowance_s}",
        runs=tmp_path,
        timeout=180,
    )
    # the allowance, then judging them blocked; the subprocesses' start (spawned: importing torch
    # takes up to ~35 s on a loaded host) is computing, busy, and may outlast the allowance
    spawned_s = 35
    assert_incident(
        result,
        "startup_timeout",
        ["inline", 0],
        promised_detection_s("startup_step", startup_step_allowance_s=allowance_s) + spawned_s,
    )
    summary = result.hang_report["summary"]
    assert result.hang_report["state"] == "blocked" and "env.construct" in summary, summary
    assert "its 2 subprocesses are not computing either" in summary, summary
