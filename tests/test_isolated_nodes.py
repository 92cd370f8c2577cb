"""Simulated nodes that share nothing but the kernel (`cluster.simulate_isolation: namespaces`):
real Ray nodes in their own network, PID, mount and UTS namespaces, joined over a private bridge.
Each run is checked for anything of it left behind: namespaces, links, folders, processes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from fleetrl.cluster.isolation.bridge import SUBNET_PREFIX
from fleetrl.cluster.isolation.nodes import IsolatedNodes, sweep_stale
from tests.incidents import NOTICE_S, assert_ended_in_time, assert_incident, fault, promised_detection_s
from tests.isolation import (
    TWO_ISOLATED_NODES,
    fill_node_tmp,
    fleetrl_processes,
    isolated_drivers,
    leftovers,
    listening,
    namespace_of,
    needs_isolation,
    node_init,
    on_node,
    unroutable_interface,
    wait_for_output,
)
from tests.isolation_envs import BROKEN_MARKER
from tests.support import (
    DIRECT_LINE,
    LEARNING_GUARD_S,
    LOADED_HOST_MARGIN_S,
    Fleetrl,
    controller_of,
    detection_s,
    fleetrl,
    train,
    wait_for_watch_file,
)

pytestmark = needs_isolation
# `ray start`'s --min-worker-port and --max-worker-port defaults, which the simulated nodes keep
RAY_WORKER_PORTS = range(10002, 20000)


@pytest.fixture
def probe_folder():
    """A folder the nodes can write to: not under /tmp, which each node has of its own."""
    folder = Path(tempfile.mkdtemp(prefix="fleetrl-probe-", dir="/var/tmp"))
    yield folder
    shutil.rmtree(folder)


@pytest.fixture(autouse=True)
def swept_even_on_failure():
    """What a run a test started left (its driver killed at a timeout or after a failed assertion:
    namespaces, links and folders outlive processes) is removed after the test; a test that
    passes has asserted there was nothing."""
    before = isolated_drivers()
    yield
    sweep_stale(isolated_drivers() - before)


@pytest.fixture(scope="module")
def joined_cluster():
    """Two isolated 1-slot nodes started as a user starts a real cluster, shared by the tests
    that only point fleetrl at it; each test undoes what it changes on a node. At the end
    nothing of it is left."""
    with IsolatedNodes(2, 1) as cluster:
        cluster.wait_started()
        yield cluster
    assert leftovers(os.getpid()) == []


def joined(cluster: IsolatedNodes, run_dir: Path) -> list[str]:
    """The overrides that point a run of the tests' small job at the running `cluster`."""
    on_cluster = [o for o in TWO_ISOLATED_NODES if "simulate" not in o]
    return [*on_cluster, f"cluster.ray_address={cluster.address}", f"runner.run_dir={run_dir}"]


def test_two_isolated_nodes_30_s_apart_on_the_clock_train_listen_on_the_bridge_and_leave_nothing(
    tmp_path, probe_folder
):
    """Node 0's wall clock (every Python process of the node) 30 s behind the controller's, node
    1's 30 s ahead: heartbeat ages and phase durations are measured where they are received, so
    the run trains to its end with no false stall; each node is its own machine; while it trains,
    none of fleetrl's listeners, in any of its processes, is on every address (0.0.0.0, ::), and
    the supervisor's store is on the bridge only; nothing is left."""
    hold = probe_folder / "hold"
    hold.touch()  # each env step takes 0.3 s while it exists: the test looks meanwhile
    command = [
        "train",
        "configs/ppo_cartpole.yaml",
        f"runner.run_dir={tmp_path}",
        *TWO_ISOLATED_NODES,
        "cluster.simulate_clock_skew_s={0: -30, 1: 30}",
        "env.id=tests.isolation_envs:NodeProbe",
        f"env.kwargs={{folder: {probe_folder}, hold_file: {hold}}}",
        "runner.total_env_steps=128",
        "watchdog.startup_step_allowance_s=240",  # the nodes' start: over a minute on a loaded host
    ]
    # what a loopback-only run leaves in its process's environment (a sweep, a library user's
    # earlier Trainer): inherited, it made the driver register at 127.0.0.1 and Ray drop the
    # remote workers it owned at creation ("all references to the actor were removed")
    with Fleetrl(*command, runs=tmp_path, env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}) as running:
        where = json.loads(wait_for_watch_file(tmp_path, running, timeout_s=300).read_text())
        processes = fleetrl_processes(running.process.pid)
        listeners = {pid: listening(pid) for pid in processes}
        hold.unlink()
        run = running.finish(timeout=400).succeeded()
    assert sorted(processes.values()).count("actor rank 1") == 1, processes  # the workers on node 1 seen too
    assert where["host"].startswith(SUBNET_PREFIX + "."), where  # the controller's address on the bridge
    assert listeners[running.process.pid] == {(where["host"], where["port"])}, listeners
    everywhere = {
        processes[pid]: sorted(p for a, p in found if a in ("0.0.0.0", "::")) for pid, found in listeners.items()
    }
    # Ray's own gRPC server in each of its workers and drivers binds :: on a port of its worker
    # range (Ray's choice); fleetrl's listeners take ephemeral ports, and none of them is there
    assert {who: ports for who, ports in everywhere.items() if set(ports) - set(RAY_WORKER_PORTS)} == {}, listeners
    assert all(len(ports) <= 1 for ports in everywhere.values()), everywhere  # one each: Ray's
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
    for path in probe_folder.glob("[01]-*.json"):  # the node's clock against the file's (the kernel's) time
        off_by = json.loads(path.read_text())["time"] - path.stat().st_mtime
        assert abs(off_by - (-30 if path.name.startswith("0-") else 30)) < 5, (path.name, off_by)
    assert leftovers(run_pid(run)) == []


def run_pid(run) -> int:
    """The driver's pid, as the log line of the isolated nodes' namespaces names it."""
    line = next(line for line in run.stderr.splitlines() if "simulated node 0:" in line)
    return int(line.split(" in fleetrl-")[1].split("-")[0])


def test_a_killed_remote_worker_is_worker_died_and_its_nodes_are_removed(tmp_path):
    """SIGKILL of node 1's env rank on its first step: the cause names it, and the incident's
    teardown removes both namespaced nodes. Ray's word of the death is the evidence: with the
    default 5 s heartbeat timeout, a loaded host's Ray once took longer to give it, and the
    silent remote worker was reported `process_frozen` (all the watcher can say of a worker on
    another machine); the timeout is raised so that the death's own report is what is tested."""
    run = train(
        "configs/ppo_cartpole.yaml",
        *TWO_ISOLATED_NODES,
        fault("kill", "env", 1, 1),
        "watchdog.heartbeat_timeout_s=20",
        "--skip-doctor",
        runs=tmp_path,
        timeout=400,
    )
    assert run.code == 4, run.stderr[-3000:]
    assert run.hang_report["cause"] == "worker_died", run.hang_report["summary"]
    assert run.hang_report["culprit"] == ["env", 1], run.hang_report["summary"]
    assert leftovers(run_pid(run)) == []


def test_node_1_crashing_is_node_lost_naming_it_and_its_workers(tmp_path):
    """Every process of node 1 (whose clock is 30 s ahead) killed at once (its PID namespace's
    init: the machine is gone) once training runs: `node_lost` naming node 1 and both workers it
    held, within the heartbeat timeout plus a loaded host's margin, a margin smaller than the skew
    (ages on node 1's clock would detect it 30 s late); then nothing of either node is left."""
    overrides = [
        *TWO_ISOLATED_NODES,
        "cluster.simulate_clock_skew_s={1: 30}",
        "runner.total_env_steps=10000000",
        "watchdog.heartbeat_timeout_s=3",
    ]
    with Fleetrl(
        "train", "configs/ppo_cartpole.yaml", f"runner.run_dir={tmp_path}", *overrides, "--skip-doctor", runs=tmp_path
    ) as running:
        wait_for_output(running, "| steps ", timeout_s=300)
        node_init(running.process.pid, 1).kill()
        run = running.finish(timeout=120)
    report = run.hang_report
    assert run.code == 4 and report is not None, run.stderr[-3000:]
    assert report["cause"] == "node_lost", report["summary"]
    assert report["culprit"] == ["actor", 1], report["summary"]  # the lost node's first worker by key
    assert "node 1 (fleetrl-n1) is lost" in report["summary"], report["summary"]
    assert "(actor rank 1, env rank 1)" in report["summary"], report["summary"]
    # the lost node's workers stop beating: frozen or gone at the heartbeat timeout
    assert detection_s(report) <= promised_detection_s("frozen", heartbeat_timeout_s=3) + LOADED_HOST_MARGIN_S
    assert_ended_in_time(run)
    assert leftovers(run_pid(run)) == []  # the controller's cluster (the supervisor's pid tags none)


def test_node_1s_own_faults_are_named_on_node_1_by_the_doctor_run_there(tmp_path, joined_cluster):
    """Three faults only node 1 has, as the seed report's nodes had: its /tmp (Ray's temp dir)
    97% full, filled from inside its own mount namespace; a simulator whose import fails there
    only (a file in node 1's /tmp); Gloo pinned to a second interface node 0 has no route to. The
    doctor, run on the nodes (disk and env on each, the handshake between the placed actor
    ranks), names node 1 for each and fails nothing on node 0. The handshake, given 150 s, ends
    as soon as rank 0's connect failed: rank 1, which would wait in connectFullMesh for its own
    timeout (0.7 x 150 s) and then the deadline, stops then, naming rank 0."""
    node0, node1 = joined_cluster.nodes
    env = "env.id=tests.isolation_envs:BrokenWhereMarked"
    on_cluster = [*joined(joined_cluster, tmp_path), env, "cluster.env_vars={1: {GLOO_SOCKET_IFNAME: unroutable0}}"]
    checks = ["--only", "ray", "--only", "disk", "--only", "env", "--only", "gloo", "--handshake-timeout", "150"]
    with unroutable_interface(node1.netns, "unroutable0", UNROUTABLE), node_1_full_and_broken(node1):
        doctor = fleetrl("doctor", "configs/ppo_cartpole.yaml", *on_cluster, *checks, "--json")
    found = {check["name"]: check for check in json.loads(doctor.stdout)["checks"]}
    failed = {name for name, check in found.items() if check["status"] == "fail"}
    assert doctor.code == 3, doctor.stdout  # README: a preflight check failed
    assert {"disk.ray_temp.node1", "env.reset_step.node1", "gloo.handshake"} <= failed, found
    assert found["disk.ray_temp.node0"]["status"] == found["env.reset_step.node0"]["status"] == "pass", found
    full = found["disk.ray_temp.node1"]["detail"]
    assert f"node 1 ({node1.address}), host fleetrl-n1" in full, full
    assert "Ray temp directory /tmp/ray:" in full and "97% used" in full, full
    broken = found["env.reset_step.node1"]["detail"]
    assert f"node 1 ({node1.address})" in broken, broken
    assert "ImportError: libsimulator.so" in broken and "while building the env" in broken, broken
    handshake = found["gloo.handshake"]["detail"]
    assert "placed (rank 0 on node 0, rank 1 on node 1)" in handshake, handshake
    assert rank_0_end(node0) in handshake and RANK_1_END in handshake, handshake
    assert "Network is unreachable" in handshake, handshake
    assert "rank 1 failed while joining the gloo process group" in handshake, handshake
    assert "stopped waiting: rank 0 failed" in handshake, handshake
    assert found["gloo.handshake"]["seconds"] < 60, handshake  # start-up on a loaded host included; not 105 s


def test_train_does_not_start_while_node_1s_ray_temp_is_nearly_full(tmp_path, joined_cluster):
    """The same full /tmp on node 1: `fleetrl train`'s preflight (the doctor's fast checks, run
    on the nodes) refuses to start, exit 3, naming the check."""
    node1 = joined_cluster.nodes[1]
    fill_node_tmp(node1.init_pid(), used_percent=97)
    try:
        run = train("configs/ppo_cartpole.yaml", *joined(joined_cluster, tmp_path), runs=tmp_path)
    finally:
        on_node(node1.init_pid(), "rm", "/tmp/ballast")
    assert run.code == 3 and run.run_dir is None, run.stderr[-3000:]
    assert "disk.ray_temp.node1" in run.stderr and "not starting, a preflight check failed" in run.stderr


@contextlib.contextmanager
def node_1_full_and_broken(node1):
    """Node 1's /tmp 97% full and `BROKEN_MARKER` in it, both removed on leaving."""
    fill_node_tmp(node1.init_pid(), used_percent=97)
    try:
        on_node(node1.init_pid(), "touch", BROKEN_MARKER)
        yield
    finally:
        on_node(node1.init_pid(), "rm", "-f", "/tmp/ballast", BROKEN_MARKER)


UNROUTABLE = "10.212.0.1"  # below 10.213.*: Gloo's rank 0 connects to it (the lower address listens)
RANK_1_END = (
    f"actor rank 1 on node 1 (fleetrl-n1) at {UNROUTABLE} on interface unroutable0 (GLOO_SOCKET_IFNAME=unroutable0)"
)


def rank_0_end(node0) -> str:
    return f"actor rank 0 on node 0 (fleetrl-n0) at {node0.address}, its host name's address"


def test_node_1_advertising_an_unroutable_address_is_peer_unreachable_naming_both_ends(tmp_path, joined_cluster):
    """Node 1's Gloo pinned (GLOO_SOCKET_IFNAME) to a second interface whose address node 0 has no
    route to: the rendezvous succeeds, the mesh cannot. `fleetrl train` stops with
    `peer_unreachable` as soon as rank 0's connect fails, not at the 300 s join timeout, naming
    both ends: each rank's node, host, interface and address."""
    node0, node1 = joined_cluster.nodes
    with unroutable_interface(node1.netns, "unroutable0", UNROUTABLE):
        run = train(
            "configs/ppo_cartpole.yaml",
            *joined(joined_cluster, tmp_path),
            "cluster.env_vars={1: {GLOO_SOCKET_IFNAME: unroutable0}}",
            "actor.dist_timeout_s=300",
            "--skip-doctor",
            runs=tmp_path,
        )
    assert run.hang_report is not None, run.stderr[-3000:]
    assert_incident(run, "peer_unreachable", ["actor", 0], NOTICE_S)  # from the failed connect
    summary = run.hang_report["summary"]
    assert rank_0_end(node0) in summary and RANK_1_END in summary, summary
    assert "Network is unreachable" in summary, summary
    waited = float(re.search(r"within ([\d.]+) s \(timeout 300 s", summary)[1])
    assert waited < 60, summary  # a loaded host's margin; the connect fails at once


def test_seed_placement_trains_cartpole_to_475_on_two_isolated_nodes(tmp_path):
    """The seed report's layout scaled to CPU slots (actor 0-1 and rollout 0 on node 0, env 2-3
    on node 1), each node in its own namespaces: trained to the target, through the direct
    channels `auto` chooses, nothing left behind."""
    run = train(
        "configs/ppo_cartpole_2nodes.yaml",
        "runner.tensorboard=false",
        "cluster.simulate_isolation=namespaces",
        # a loaded host's margin: this test is about training, and at a load average of 50-80 on 2
        # cores a remote env's heartbeat thread once went 5 s (the default timeout) without a turn
        "watchdog.heartbeat_timeout_s=20",
        runs=tmp_path,
        timeout=LEARNING_GUARD_S,
    ).succeeded()
    assert run.summary["target_reached"] and run.summary["episode_return_last100"] >= 475, run.summary
    assert DIRECT_LINE in run.stderr, run.stderr[-3000:]  # the graph: 0.03x inline, and false freezes
    assert leftovers(run_pid(run)) == []


def test_node_1_gloo_on_loopback_is_named_by_the_doctor_run_on_node_1(tmp_path, joined_cluster):
    """Node 1's Gloo bound to loopback (GLOO_SOCKET_IFNAME=lo in cluster.env_vars.1) while the
    actor's ranks span the nodes: the doctor, run on node 1 with node 1's variables, names node 1,
    the interface and what to set instead (node 1's own eth0); node 0 fails nothing."""
    on_cluster = [*joined(joined_cluster, tmp_path), "cluster.env_vars={1: {GLOO_SOCKET_IFNAME: lo}}"]
    doctor = fleetrl("doctor", "configs/ppo_cartpole.yaml", *on_cluster, "--only", "ray", "--only", "network")
    lines = doctor.stdout.splitlines()
    advertised = next(line for line in lines if "network.advertised_address.node1 " in line)
    assert doctor.code == 3 and advertised.startswith("FAIL"), doctor.stdout
    node1 = joined_cluster.nodes[1].address
    assert f"node 1 ({node1})" in advertised and "interface lo" in advertised, advertised
    fix = lines[lines.index(advertised) + 1]
    assert "set GLOO_SOCKET_IFNAME" in fix and f"eth0 ({node1})" in fix, fix
    node0 = [line for line in lines if ".node0 " in line]
    assert node0 and not any(line.startswith("FAIL") for line in node0), doctor.stdout
    assert next(line for line in node0 if "network.advertised_address" in line).startswith("PASS"), node0


@contextlib.contextmanager
def training_on_until_stopped(run_dir: Path) -> Iterator[tuple[Fleetrl, psutil.Process]]:
    """`fleetrl train` on two isolated nodes with a budget it will not reach, once it trains, and
    its controller (the namespaces, links and folder are named after its pid); the test stops it
    (on leaving, whatever is still running of it is killed)."""
    with Fleetrl(
        "train",
        "configs/ppo_cartpole.yaml",
        f"runner.run_dir={run_dir}",
        *TWO_ISOLATED_NODES,
        "runner.total_env_steps=10000000",
        "--skip-doctor",
        runs=run_dir,
    ) as running:
        wait_for_output(running, "| steps ", timeout_s=300)
        controller = controller_of(running)
        assert controller is not None, running.stderr_so_far()[-3000:]
        yield running, controller


def test_a_second_ctrl_c_stops_at_once_and_removes_the_namespaces_itself(tmp_path):
    """Ctrl-C twice while an isolated run trains, its controller stopped (SIGSTOP) so the first
    cannot finish: the second stops at once (exit 130, every process killed) and removes the
    namespaces, links and folder, which outlive processes, itself: none left for the next start."""
    with training_on_until_stopped(tmp_path) as (running, controller):
        controller.suspend()  # the first Ctrl-C's clean stop cannot finish (the watchdog's verdict is 5 s away)
        running.process.send_signal(signal.SIGINT)
        wait_for_output(running, "asking the controller to checkpoint and stop", timeout_s=30)
        running.process.send_signal(signal.SIGINT)
        run = running.finish(timeout=60)
    assert run.code == 130, run.stderr[-3000:]
    assert "fleetrl: second SIGINT: stopping now" in run.stderr, run.stderr[-3000:]
    assert run.hang_report is None, run.hang_report["summary"]
    assert not controller.is_running()
    assert leftovers(controller.pid) == []


def test_what_a_killed_controller_left_is_swept_by_the_next_start(tmp_path):
    """`kill -9` of `fleetrl train` (and of every process it started) mid-run leaves its
    namespaces, links and folder, which outlive processes; the next isolated start removes them."""
    with training_on_until_stopped(tmp_path) as (running, controller):
        running.kill()
    left = leftovers(controller.pid)
    assert f"fleetrl-{controller.pid}-n1" in left, left
    swept = sweep_stale({controller.pid})  # (a veth may go with its namespace before it is named here)
    assert {f"fleetrl-{controller.pid}-n0", f"fleetrl-{controller.pid}-n1"} <= set(swept), swept
    assert leftovers(controller.pid) == []
