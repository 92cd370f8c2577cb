"""Nothing of a run outlives `kill -9` of `fleetrl train` (issue 10): the janitor it starts finds
every process carrying the run's token — Ray's daemons, agents and workers included — kills
them, and forgets Ray's `ray_current_cluster` where it names the run's dead cluster. Killed once
training, and killed during start-up right after Ray started. What is left is counted from the
test's side (tests/support.py `Fleetrl.kill_9`: every descendant of `fleetrl train` it sampled),
not by the janitor's own scanner."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from fleetrl.supervise.janitor import processes_of_run
from tests.support import TEARDOWN_PROMISE_S, Fleetrl, run_janitor

SMALL_ON_RAY = [
    "runner.tensorboard=false",
    "cluster.backend=ray",
    "env.num_envs=1",
    "algorithm.num_steps=8",
    "algorithm.minibatch_size=8",
    "algorithm.update_epochs=1",
    "runner.total_env_steps=1000000",
    "--skip-doctor",
]
GONE_WITHIN_S = TEARDOWN_PROMISE_S  # issue 10's promise: no process of the run alive 10 s after the kill


def wait_until(condition, timeout_s: float, what: str, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(poll_s)
    return value


def assert_nothing_left(train: Fleetrl) -> None:
    left = train.kill_9()
    assert not left, f"alive {GONE_WITHIN_S:g} s (and the loaded host's margin) after kill -9: {left}"


def test_kill_9_of_train_once_it_is_training_leaves_nothing(tmp_path):
    runs = tmp_path / "runs"
    command = ["train", "configs/ppo_cartpole.yaml", f"runner.run_dir={runs}", *SMALL_ON_RAY]
    with Fleetrl(*command, runs=runs) as train:
        token, _ = run_janitor(train)
        wait_until(lambda: [m for m in runs.glob("*/metrics.jsonl") if m.read_text().strip()], 180, "no iteration")
        names = {p.name() for p in processes_of_run(token)}  # the token reaches the workers too
        assert {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
        assert any(name.startswith("ray::WorkerHost") for name in names), names
        assert_nothing_left(train)
        assert "process(es) of the run outlived `fleetrl train`" in train.stderr_so_far()


def test_kill_9_during_start_up_leaves_nothing_and_forgets_the_dead_cluster(tmp_path):
    """Two simulated nodes: Ray's `Cluster` writes ray_current_cluster as soon as its head is up.
    A Ray temp folder of the test's own keeps other sessions' clusters out of the check."""
    with tempfile.TemporaryDirectory(prefix="fr-", dir="/tmp") as ray_tmp:  # short: Ray's socket paths
        address_file = Path(ray_tmp) / "ray" / "ray_current_cluster"
        runs = tmp_path / "runs"
        two_nodes = ["cluster.num_nodes=2", "cluster.simulate_nodes=2", "cluster.devices_per_node=1"]
        placement = ["cluster.component_placement={actor: 0, rollout: 0, env: 1}"]
        command = [
            "train",
            "configs/ppo_cartpole.yaml",
            f"runner.run_dir={runs}",
            *SMALL_ON_RAY,
            *two_nodes,
            *placement,
        ]
        with Fleetrl(*command, runs=runs, env={"RAY_TMPDIR": ray_tmp}) as train:
            token, _ = run_janitor(train)
            # the token reaches Ray's daemons and its agents (which rewrite their process title)
            daemons = {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"}
            wait_until(
                lambda: address_file.exists() and daemons <= {p.name() for p in processes_of_run(token)},
                120,
                "Ray did not start: " + train.stderr_so_far()[-2000:],
                poll_s=0.05,
            )
            assert_nothing_left(train)
            assert not address_file.exists(), address_file.read_text()
            assert f"removed {address_file}" in train.stderr_so_far()
