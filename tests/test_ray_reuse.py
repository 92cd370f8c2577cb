"""Joining a running local Ray instance (`cluster.ray_address`): the run's workers are actors of
that instance, and when the run ends the instance is still running, with none of the run's actors
alive. The instance is the user's: `ray start --head --block` in the foreground, on 127.0.0.1, in a
temp directory of the test's own (its whole process tree removed at the end, pass or fail)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from fleetrl.net import free_port
from tests.support import Fleetrl, end, first_iteration, fleetrl, held_cartpole, subprocess_env, train

RAY = str(Path(sys.executable).parent / "ray")
# Ray's token authentication, explicitly (as every driver of a cluster that uses it must say), and
# 127.0.0.1 kept as the node's address (fleetrl/cluster/ray/cluster.py set_ray_loopback).
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
    yield from ray_head(RAY_ENV)


@pytest.fixture
def token_ray():
    """A Ray head whose token the user gives explicitly (`RAY_AUTH_TOKEN`, not Ray's default
    ~/.ray/auth_token); yields its address and the environment its clients need."""
    env = RAY_ENV | {"RAY_AUTH_TOKEN": uuid.uuid4().hex}
    for address in ray_head(env):
        yield address, env


def ray_head(ray_env: dict):
    """Start a Ray head with `ray_env`; yield its address; end its whole process tree."""
    temp_dir = tempfile.mkdtemp(prefix="fr-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port = free_port("127.0.0.1")
    env = {**subprocess_env(), **ray_env}
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1"]
        + ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_listening(head, port)
        yield f"127.0.0.1:{port}"
        assert head.poll() is None, "the Ray instance the run joined is gone"
    finally:
        end([*psutil.Process(head.pid).children(recursive=True), psutil.Process(head.pid)])
        shutil.rmtree(temp_dir, ignore_errors=True)


def wait_until_listening(head: subprocess.Popen, port: int, timeout_s: float = 120) -> None:
    """Until the head's GCS accepts connections, as a user waits for `ray start` to say it has
    started: a run started before then is rightly refused by the doctor's ray.cluster check
    (and once was, here, when `fleetrl train` began starting faster than a loaded host's Ray)."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert head.poll() is None, f"ray start --head exited with {head.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"the Ray head's port {port} did not listen within {timeout_s:.0f} s"
            time.sleep(0.2)


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


@pytest.mark.slow  # a Ray head, a run joining it, top and the whole doctor: ~3 min on a loaded 2-core host
def test_a_token_authenticated_cluster_works_with_train_top_and_doctor(tmp_path, token_ray):
    """Ray's token authentication (RAY_AUTH_MODE=token, the token in RAY_AUTH_TOKEN): `fleetrl
    train` joins it, `fleetrl top` shows the live run, `fleetrl doctor` passes against it; the
    token is in no file of the run. A client without the token is turned away (the check that the
    cluster really is authenticated)."""
    address, env = token_ray
    runs, hold = tmp_path / "runs", tmp_path / "hold"
    hold.touch()  # each env step takes 0.3 s while it exists
    joined = [
        "cluster.backend=ray",
        f"cluster.ray_address={address}",
        "cluster.devices_per_node=1",
        "cluster.component_placement={actor: 0, rollout: 0, env: 0}",
    ]
    command = held_cartpole(runs, hold, *joined, "runner.total_env_steps=400")
    with Fleetrl(*command, runs=runs, env=env) as running:
        top = fleetrl("top", str(first_iteration(runs, running, timeout_s=240)), timeout=120)
        assert top.code == 0, top.stderr[-3000:]
        shown = {line.split()[0] for line in top.stdout.splitlines()[1:] if line.strip()}
        assert {"env", "rollout", "actor", "controller"} <= shown, top.stdout
        hold.unlink()
        run = running.finish(timeout=300).succeeded()
    assert f"joined the running Ray instance at {address}" in run.stderr, run.stderr[-3000:]
    token = env["RAY_AUTH_TOKEN"].encode()
    assert not any(token in path.read_bytes() for path in run.run_dir.rglob("*") if path.is_file())

    doctor = fleetrl("doctor", "configs/ppo_cartpole.yaml", *joined, "--handshake-timeout=60", timeout=300, env=env)
    assert doctor.code == 0, doctor.stdout[-3000:] + doctor.stderr[-3000:]
    stranger = subprocess.run(
        [sys.executable, "-c", QUERY, address],
        env={**subprocess_env(), **RAY_ENV, "RAY_AUTH_TOKEN": "not-the-token"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stranger.returncode != 0 and "uthenticat" in stranger.stderr, stranger.stderr[-3000:]
