"""Joining a running local Ray instance (`cluster.ray_address`): the run's workers are actors of
that instance, and when the run ends the instance is still running, with none of the run's actors
alive. The instance is the user's: `ray start --head --block` in the foreground, on 127.0.0.1, in a
temp directory of the test's own (its whole process tree removed at the end, pass or fail)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from fleetrl.parallel.net import free_port
from tests.support import end, subprocess_env, train

RAY = str(Path(sys.executable).parent / "ray")
# Ray's token authentication, explicitly (as every driver of a cluster that uses it must say), and
# 127.0.0.1 kept as the node's address (fleetrl/cluster/ray_cluster.py set_ray_loopback).
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Runs in a fresh interpreter against the instance: (name, state) of every actor it has known, and
# proof that it still runs work.
QUERY = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
actors = [(a["Name"], a["State"]) for a in ray._private.state.actors().values()]
alive = ray.get(ray.remote(lambda: "alive").remote())
print(json.dumps({"actors": actors, "work": alive}))
"""


@pytest.fixture
def running_ray():
    """A Ray head started as a user would; yields its address."""
    temp_dir = tempfile.mkdtemp(prefix="fr-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = free_port("127.0.0.1")
    env = {**subprocess_env(), **RAY_ENV}
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1"]
        + ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"127.0.0.1:{port}"
        assert head.poll() is None, "the Ray instance the run joined is gone"
    finally:
        end([*psutil.Process(head.pid).children(recursive=True), psutil.Process(head.pid)])
        shutil.rmtree(temp_dir, ignore_errors=True)


def query(address: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", QUERY, address],
        env={**subprocess_env(), **RAY_ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_run_joins_a_running_instance_and_leaves_it_running_without_its_actors(tmp_path, running_ray):
    run = train(
        "configs/ppo_cartpole.yaml",
        "runner.tensorboard=false",
        "cluster.backend=ray",
        f"cluster.ray_address={running_ray}",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, rollout: 0, env: 0}",
        "env.num_envs=2",
        "algorithm.num_steps=8",
        "algorithm.minibatch_size=16",
        "runner.total_env_steps=32",
        runs=tmp_path,
        timeout=300,
        env={"RAY_AUTH_MODE": "token"},
    ).succeeded()
    assert f"joined the running Ray instance at {running_ray}" in run.stderr, run.stderr[-3000:]
    after = query(running_ray)
    assert after["work"] == "alive"
    # The instance is the test's own: every actor it has known is the run's.
    components = sorted(name.split("-")[1] for name, _ in after["actors"] if name.startswith("fleetrl-"))
    assert components == ["actor", "env", "rollout"], after["actors"]
    assert {state for _, state in after["actors"]} == {"DEAD"}, after["actors"]
