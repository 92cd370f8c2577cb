"""Nothing of a run outlives `kill -9` of `fleetrl train` (issue 10): the janitor it starts finds
every process carrying the run's token — Ray's daemons, agents and workers included — kills
them, and forgets Ray's `ray_current_cluster` where it names the run's dead cluster. Killed once
training, and killed during start-up right after Ray started."""

from __future__ import annotations

import contextlib
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from fleetrl.supervise.janitor import processes_of_run
from tests.support import Fleetrl, end, run_janitor

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
GONE_WITHIN_S = 10.0  # issue 10's promise: no process of the run alive 10 s after the kill


@contextlib.contextmanager
def killed_at_exit(train: Fleetrl) -> Iterator[str]:
    """The run's token; whatever happens in the block, every process carrying it is killed after."""
    token, _ = run_janitor(train)
    try:
        yield token
    finally:
        end(processes_of_run(token))


def wait_until(condition, timeout_s: float, what: str, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(poll_s)
    return value


def running_of_run(token: str) -> list[psutil.Process]:
    """The run's processes that still run (a zombie has ended; its reaping is its adopter's)."""
    running = []
    for process in processes_of_run(token):
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
    return running


def assert_nothing_left(token: str, train: Fleetrl) -> None:
    train.process.wait(10)
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := running_of_run(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"{len(left)} process(es) of the run alive {GONE_WITHIN_S:g} s after kill -9: " + ", ".join(
        f"{p.pid} {p.name()}" for p in left
    )


def test_kill_9_of_train_once_it_is_training_leaves_nothing(tmp_path):
    runs = tmp_path / "runs"
    command = ["train", "configs/ppo_cartpole.yaml", f"runner.run_dir={runs}", *SMALL_ON_RAY]
    with Fleetrl(*command, runs=runs) as train, killed_at_exit(train) as token:
        wait_until(lambda: [m for m in runs.glob("*/metrics.jsonl") if m.read_text().strip()], 180, "no iteration")
        names = {p.name() for p in processes_of_run(token)}  # the token reaches the workers too
        assert {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
        assert any(name.startswith("ray::WorkerHost") for name in names), names
        train.process.send_signal(signal.SIGKILL)
        assert_nothing_left(token, train)
        train.ended = True
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
        with Fleetrl(*command, runs=runs, env={"RAY_TMPDIR": ray_tmp}) as train, killed_at_exit(train) as token:
            # the token reaches Ray's daemons and its agents (which rewrite their process title)
            daemons = {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"}
            wait_until(
                lambda: address_file.exists() and daemons <= {p.name() for p in processes_of_run(token)},
                120,
                "Ray did not start: " + train.stderr_so_far()[-2000:],
                poll_s=0.05,
            )
            train.process.send_signal(signal.SIGKILL)
            assert_nothing_left(token, train)
            train.ended = True
            assert not address_file.exists(), address_file.read_text()
            assert f"removed {address_file}" in train.stderr_so_far()
