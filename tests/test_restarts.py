"""Restarts that continue (`runner.max_restarts`): after an incident the supervisor starts the
controller again from the newest intact checkpoint, and the run goes on from there — its
iterations and env steps continue, one record per iteration, none lost and none repeated — to a
return a random policy never reaches; a fault that keeps coming back ends the run with exit 4,
every attempt named in the last report.

The simulator crashes once (tests/supervisor_envs.py `CrashOnce`), in iteration 6, two iterations
after the checkpoint of iteration 4 (`checkpoint_interval` 4): iteration 5 was logged and is
trained again, its first record set aside (metrics-replaced.jsonl).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.incidents import NOTICE_S, assert_incident, fault
from tests.support import LEARNING_GUARD_S, train

CONFIG = "configs/ppo_cartpole.yaml"
STEPS_PER_ITERATION = 256  # the config's 8 envs x 32 steps
CRASH_STEP = 5 * 32 + 10  # each env's 170th step: in iteration 6
# A random policy's CartPole episodes last ~22 steps (a last-100 mean of 30 is already more than
# five standard deviations of that mean away): 100 is reached by learning only.
TARGET = 100
BACKENDS = {
    "inline": [],
    "ray": [
        "cluster.backend=ray",
        "cluster.devices_per_node=2",
        "cluster.component_placement={actor: 0, env: 0-1, rollout: 0}",
    ],
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_crash_costs_one_restart_and_the_run_continues_from_its_checkpoint_to_a_learned_return(tmp_path, backend):
    marker, runs = tmp_path / "crashed", tmp_path / "runs"
    result = train(
        CONFIG,
        *BACKENDS[backend],
        "env.id=tests.supervisor_envs:CrashOnce",
        f"env.kwargs={{marker: {marker}, at_step: {CRASH_STEP}}}",
        "runner.max_restarts=2",
        "runner.checkpoint_interval=4",
        f"runner.target_return={TARGET}",
        "runner.total_env_steps=200000",
        "runner.tensorboard=false",
        "--skip-doctor",
        runs=runs,
        timeout=LEARNING_GUARD_S,
    ).succeeded()
    ended_at = time.time()
    summary, records = result.summary, result.metrics
    assert marker.exists()
    assert summary["restarts"] == 1 and summary["restart_causes"] == ["worker_exception"], summary
    assert summary["target_reached"] and summary["episode_return_last100"] >= TARGET, summary
    # one record per iteration, in order, the env steps of each continuing the last's
    assert [r["iteration"] for r in records] == list(range(1, len(records) + 1))
    assert [r["global_step"] for r in records] == [STEPS_PER_ITERATION * i for i in range(1, len(records) + 1)]
    assert records[-1]["iteration"] == summary["iterations"] and records[-1]["global_step"] == summary["global_step"]
    # the restart resumed the checkpoint of iteration 4 and trained 5 again, its first record set aside
    (first_after,) = [r for r in records if "restarts" in r]
    assert first_after["iteration"] == 5 and first_after["restarts"] == 1, first_after
    replaced = [json.loads(line) for line in (result.run_dir / "metrics-replaced.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in replaced] == [5]
    assert "resumed" in result.stderr and "at iteration 4, 1024 env steps" in result.stderr, result.stderr[-3000:]
    kept = json.loads((result.run_dir / "hang_report-1.json").read_text())
    assert kept["cause"] == "worker_exception" and "the simulator crashed" in kept["detail"] + kept["summary"], kept
    # restart_s spans the incident's start to training again: past the report, before the run's end
    (restart_s,) = summary["restart_s"]
    assert kept["detected_after_s"] < restart_s < ended_at - kept["incident_started"], (restart_s, kept)


def test_a_fault_that_keeps_coming_back_ends_the_run_with_every_attempt_in_the_report(tmp_path):
    """The env raises at its 40th step in every attempt: two restarts, then exit 4; the last report
    lists both earlier attempts with their kept reports and why the third did not restart."""
    result = train(
        CONFIG,
        fault("exception", "env", 0, 40),
        "env.num_envs=4",
        "algorithm.num_steps=16",
        "algorithm.minibatch_size=32",
        "runner.max_restarts=2",
        "runner.tensorboard=false",
        "--skip-doctor",
        runs=tmp_path,
        timeout=300,
    )
    assert_incident(result, "worker_exception", ["env", 0], NOTICE_S)
    report = result.hang_report
    assert [(r["number"], r["cause"]) for r in report["restarts"]] == [(1, "worker_exception"), (2, "worker_exception")]
    for restart in report["restarts"]:
        kept = json.loads(open(restart["report"]).read())
        assert kept["cause"] == "worker_exception" and kept["incident_started"] == restart["incident_at"], kept
    assert report["not_restarted"].startswith("2 restart(s) within runner.restart_window_s=3600"), report
    text = (result.run_dir / "hang_report.txt").read_text()
    assert "restarts before this incident (2); not restarted: 2 restart(s)" in text, text[-2000:]
    assert "not restarting: 2 restart(s)" in result.stderr
