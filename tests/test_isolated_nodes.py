"""Simulated nodes that share nothing but the kernel (`cluster.simulate_isolation: namespaces`):
real Ray nodes in their own network, PID, mount and UTS namespaces, joined over a private bridge.
Each run is checked for anything of it left behind: namespaces, links, folders, processes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from fleetrl.cluster.isolated_nodes import IsolatedNodes, sweep_stale
from tests.incidents import fault
from tests.isolation import (
    TWO_ISOLATED_NODES,
    fill_node_tmp,
    leftovers,
    namespace_of,
    namespaced_pids,
    needs_isolation,
    node_init,
    wait_for_output,
)
from tests.support import Fleetrl, fleetrl, train

pytestmark = needs_isolation


@pytest.fixture
def probe_folder():
    """A folder the nodes can write to: not under /tmp, which each node has of its own."""
    folder = Path(tempfile.mkdtemp(prefix="fleetrl-probe-", dir="/var/tmp"))
    yield folder
    shutil.rmtree(folder)


def test_two_isolated_nodes_train_and_leave_nothing(tmp_path, probe_folder):
    before = namespaced_pids()
    run = train(
        "configs/ppo_cartpole.yaml",
        *TWO_ISOLATED_NODES,
        "env.id=tests.isolation_envs:NodeProbe",
        f"env.kwargs={{folder: {probe_folder}}}",
        "runner.total_env_steps=128",
        runs=tmp_path,
        timeout=400,
        # what a loopback-only run leaves in its process's environment (a sweep, a library user's
        # earlier Trainer): inherited, it made the driver register at 127.0.0.1 and Ray drop the
        # remote workers it owned at creation ("all references to the actor were removed")
        env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
    ).succeeded()
    assert (run.summary["iterations"], run.summary["global_step"]) == (4, 128), run.summary  # 2 envs x 16 steps
    seen = {s["node"]: s for s in map(json.loads, map(Path.read_text, probe_folder.glob("[01]-*.json")))}
    assert set(seen) == {"0", "1"}, seen
    assert [seen[n]["hostname"] for n in "01"] == ["fleetrl-n0", "fleetrl-n1"]
    for kind in ("pid_namespace", "net_namespace"):
        assert seen["0"][kind] != seen["1"][kind], seen
        assert namespace_of("self", kind.split("_")[0]) not in (seen["0"][kind], seen["1"][kind]), seen
    addresses = [seen[n]["addresses"] for n in "01"]
    assert len(addresses[0]) == len(addresses[1]) == 1 and addresses[0] != addresses[1], addresses
    assert addresses[0][0].rsplit(".", 1)[0] == addresses[1][0].rsplit(".", 1)[0], addresses  # one /24
    for node, other in ("01", "10"):  # each /tmp holds its own Ray and its own probe's marker only
        assert {"ray", f"fleetrl-probe-fleetrl-n{node}"} <= set(seen[node]["tmp"]), seen[node]
        assert f"fleetrl-probe-fleetrl-n{other}" not in seen[node]["tmp"], seen[node]
    assert not list(Path("/tmp").glob("fleetrl-probe-fleetrl-n*"))
    assert leftovers(run_pid(run), before) == []


def run_pid(run) -> int:
    """The driver's pid, as the log line of the isolated nodes' namespaces names it."""
    line = next(line for line in run.stderr.splitlines() if "simulated node 0:" in line)
    return int(line.split(" in fleetrl-")[1].split("-")[0])


@pytest.mark.slow
def test_a_killed_remote_worker_is_worker_died_and_its_nodes_are_removed(tmp_path):
    """SIGKILL of node 1's env rank on its first step: the cause names it, and the incident's
    teardown removes both namespaced nodes."""
    before = namespaced_pids()
    run = train(
        "configs/ppo_cartpole.yaml",
        *TWO_ISOLATED_NODES,
        fault("kill", "env", 1, 1),
        "--skip-doctor",
        runs=tmp_path,
        timeout=400,
    )
    assert run.code == 4, run.stderr[-3000:]
    assert run.hang_report["cause"] == "worker_died", run.hang_report["summary"]
    assert run.hang_report["culprit"] == ["env", 1], run.hang_report["summary"]
    assert leftovers(run_pid(run), before) == []


def test_node_1_crashing_is_node_lost_naming_it_and_its_workers(tmp_path):
    """Every process of node 1 killed at once (its PID namespace's init: the machine is gone)
    once training runs: `node_lost` naming node 1 and both workers it held, within the heartbeat
    timeout plus a loaded host's margin; then nothing of either node is left."""
    before = namespaced_pids()
    overrides = [*TWO_ISOLATED_NODES, "runner.total_env_steps=10000000", "watchdog.heartbeat_timeout_s=3"]
    with Fleetrl(
        "train", "configs/ppo_cartpole.yaml", f"runner.run_dir={tmp_path}", *overrides, "--skip-doctor", runs=tmp_path
    ) as running:
        wait_for_output(running, "| steps ", timeout_s=300)
        node_init(running.process.pid, 1).kill()
        run = running.finish(timeout=120)
    report = run.hang_report
    assert run.code == 4 and report is not None, run.stderr[-3000:]
    assert report["cause"] == "node_lost", report["summary"]
    assert report["culprit"] in (["env", 1], ["actor", 1]), report["summary"]
    assert "node 1 (fleetrl-n1) is lost" in report["summary"], report["summary"]
    assert "(actor rank 1, env rank 1)" in report["summary"], report["summary"]
    assert report["detected_after_s"] <= 3 + 30, report["detected_after_s"]
    assert leftovers(running.process.pid, before) == []


@pytest.mark.slow
def test_node_1_ray_temp_nearly_full_fails_the_doctor_there_and_train_does_not_start(tmp_path):
    """The seed's full /tmp/ray, on the node that is not the driver's: two isolated nodes started
    as a user starts a real cluster, node 1's /tmp filled to 97% from inside its own mount
    namespace; the doctor (run on every node through Ray) names node 1, its host and the path,
    and `fleetrl train` on that cluster refuses to start (exit 3) with nothing of it left."""
    before = namespaced_pids()
    with IsolatedNodes(2, 1) as cluster:
        cluster.wait_started()
        fill_node_tmp(cluster.nodes[1].init_pid(), used_percent=97)
        on_cluster = [
            "cluster.simulate_nodes=0",
            f"cluster.ray_address={cluster.address}",
            f"runner.run_dir={tmp_path}",
        ]
        doctor = fleetrl("doctor", "configs/ppo_cartpole_2nodes.yaml", *on_cluster, "--only", "ray", "--only", "disk")
        run = train("configs/ppo_cartpole_2nodes.yaml", *on_cluster, runs=tmp_path)
    lines = {line.split()[1]: line for line in doctor.stdout.splitlines() if line.startswith(("PASS", "FAIL"))}
    assert doctor.code != 0, doctor.stdout
    assert lines["disk.ray_temp.node0"].startswith("PASS"), doctor.stdout
    node1 = lines["disk.ray_temp.node1"]
    assert node1.startswith("FAIL") and f"node 1 ({cluster.nodes[1].address}), host fleetrl-n1" in node1, node1
    assert "Ray temp directory /tmp/ray:" in node1 and "97% used" in node1, node1
    assert run.code == 3 and run.run_dir is None, run.stderr[-3000:]
    assert "disk.ray_temp.node1" in run.stderr and "not starting, a preflight check failed" in run.stderr
    assert leftovers(os.getpid(), before) == []


@pytest.mark.slow
@pytest.mark.parametrize("skew_s", [-30, 30])
def test_node_1_clock_off_by_30_s_is_no_stall(tmp_path, probe_folder, skew_s):
    """Node 1's wall clock (every Python process of the node) 30 s behind or ahead of the
    controller's: heartbeat ages and phase durations are measured where they are received, so
    the run trains to its end with no incident."""
    train(
        "configs/ppo_cartpole.yaml",
        *TWO_ISOLATED_NODES,
        f"cluster.simulate_clock_skew_s={{1: {skew_s}}}",
        "env.id=tests.isolation_envs:NodeProbe",
        f"env.kwargs={{folder: {probe_folder}}}",
        "runner.total_env_steps=256",
        "--skip-doctor",
        runs=tmp_path,
        timeout=400,
    ).succeeded()
    for path in probe_folder.glob("[01]-*.json"):  # the node's clock against the file's (the kernel's) time
        off_by = json.loads(path.read_text())["time"] - path.stat().st_mtime
        assert abs(off_by - (skew_s if path.name.startswith("1-") else 0)) < 5, (path.name, off_by)


@pytest.mark.slow
def test_seed_placement_trains_cartpole_to_475_on_two_isolated_nodes(tmp_path):
    """The seed report's layout scaled to CPU slots (actor 0-1 and rollout 0 on node 0, env 2-3
    on node 1), each node in its own namespaces: trained to the target, nothing left behind."""
    before = namespaced_pids()
    run = train(
        "configs/ppo_cartpole_2nodes.yaml",
        "runner.tensorboard=false",
        "cluster.simulate_isolation=namespaces",
        runs=tmp_path,
        timeout=900,
    ).succeeded()
    assert run.summary["target_reached"] and run.summary["episode_return_last100"] >= 475, run.summary
    assert leftovers(run_pid(run), before) == []


@pytest.mark.slow
def test_node_1_gloo_on_loopback_is_named_by_the_doctor_run_on_node_1(tmp_path):
    """Node 1's Gloo bound to loopback (GLOO_SOCKET_IFNAME=lo in cluster.env_vars.1) while the
    actor's ranks span the nodes: the doctor, run on node 1 with node 1's variables, names node 1,
    the interface and what to set instead (node 1's own eth0); node 0 fails nothing."""
    before = namespaced_pids()
    with IsolatedNodes(2, 1) as cluster:
        cluster.wait_started()
        on_cluster = [
            *(o for o in TWO_ISOLATED_NODES if "simulate" not in o),
            f"cluster.ray_address={cluster.address}",
            "cluster.env_vars={1: {GLOO_SOCKET_IFNAME: lo}}",
            f"runner.run_dir={tmp_path}",
        ]
        doctor = fleetrl("doctor", "configs/ppo_cartpole.yaml", *on_cluster, "--only", "ray", "--only", "network")
    lines = doctor.stdout.splitlines()
    advertised = next(line for line in lines if "network.advertised_address.node1 " in line)
    assert doctor.code != 0 and advertised.startswith("FAIL"), doctor.stdout
    assert f"node 1 ({cluster.nodes[1].address})" in advertised and "interface lo" in advertised, advertised
    fix = lines[lines.index(advertised) + 1]
    assert "set GLOO_SOCKET_IFNAME" in fix and f"eth0 ({cluster.nodes[1].address})" in fix, fix
    node0 = [line for line in lines if ".node0 " in line]
    assert node0 and not any(line.startswith("FAIL") for line in node0), doctor.stdout
    assert next(line for line in node0 if "network.advertised_address" in line).startswith("PASS"), node0
    assert leftovers(os.getpid(), before) == []


@pytest.mark.slow
def test_what_a_killed_controller_left_is_swept_by_the_next_start(tmp_path):
    """`kill -9` of `fleetrl train` (and of every process it started) mid-run leaves its
    namespaces, links and folder, which outlive processes; the next isolated start removes them."""
    before = namespaced_pids()
    with Fleetrl(
        "train",
        "configs/ppo_cartpole.yaml",
        f"runner.run_dir={tmp_path}",
        *TWO_ISOLATED_NODES,
        "runner.total_env_steps=10000000",
        "--skip-doctor",
        runs=tmp_path,
    ) as running:
        wait_for_output(running, "| steps ", timeout_s=300)
        running.kill()
    left = leftovers(running.process.pid, before)
    assert f"fleetrl-{running.process.pid}-n1" in left, left
    swept = sweep_stale()  # (a veth may go with its namespace before it is named here)
    assert {f"fleetrl-{running.process.pid}-n0", f"fleetrl-{running.process.pid}-n1"} <= set(swept), swept
    assert leftovers(running.process.pid, before) == []
