"""What the isolated-node tests share: the run's small CartPole on two namespaced nodes, what a
run may leave behind (namespaces, links, work folders, processes in other namespaces), how
to crash a simulated node from outside, and what the run's own processes listen on."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from fleetrl.cluster.isolation.nodes import CLUSTER_MARK, LINK_PATTERN, NETNS_PATTERN, WORK_DIR_PATTERN, WORK_ROOT

needs_isolation = pytest.mark.needs("namespaces", "simulated nodes isolated in network, PID and mount namespaces")

# Two 1-slot nodes joined over the bridge: the actor's two DDP ranks on different nodes (Gloo
# across the bridge), the rollout worker on node 0, an env rank on each node.
TWO_ISOLATED_NODES = [
    "runner.tensorboard=false",
    "cluster.backend=ray",
    "cluster.num_nodes=2",
    "cluster.simulate_nodes=2",
    "cluster.simulate_isolation=namespaces",
    "cluster.devices_per_node=1",
    "cluster.component_placement={actor: 0-1, rollout: 0, env: 0-1}",
    "env.num_envs=2",
    "algorithm.num_steps=16",
    "algorithm.minibatch_size=16",
    "algorithm.update_epochs=1",
]


def namespace_of(pid: int | str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def cluster_processes(tag: int) -> list[int]:
    """The running processes of the simulated cluster tagged `tag` (the pid of the process that
    started it): each carries the tag in its environment, wherever it was reparented to. Other
    clusters, and other namespaces on this machine, are not this test's business."""
    found = []
    for process in psutil.process_iter():
        try:
            marked = process.environ().get(CLUSTER_MARK) == str(tag)
        except psutil.Error:
            continue
        if marked and running(process.pid):
            found.append(process.pid)
    return found


def leftovers(tag: int) -> list[str]:
    """Everything of the simulated cluster tagged `tag` still there: its namespaces, links, work
    folder and running processes."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    found = [line.split()[0] for line in netns.splitlines() if line.startswith(f"fleetrl-{tag}-")]
    found += [name for name in psutil.net_if_addrs() if name.startswith(f"frl{tag}")]
    found += [str(p) for p in [WORK_ROOT / f"fleetrl-iso-{tag}"] if p.exists()]
    found += [f"pid {pid}" for pid in cluster_processes(tag)]
    return found


def running(pid: int) -> bool:
    """Whether `pid` still runs. A zombie does not: it is killed and waits for this machine's init,
    which adopts a killed node's orphans once the run that made them has exited, to reap it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def isolated_drivers() -> set[int]:
    """The pids of the runs whose namespaces, links or work folders are on this machine now."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    names = [*netns, *psutil.net_if_addrs(), *(path.name for path in WORK_ROOT.glob("fleetrl-iso-*"))]
    patterns = (NETNS_PATTERN, LINK_PATTERN, WORK_DIR_PATTERN)
    return {int(match[1]) for name in names for pattern in patterns if (match := pattern.match(name))}


def node_init(driver_pid: int, node: int) -> psutil.Process:
    """The root-namespace process of simulated node `node`'s PID-namespace init (its `unshare`'s child)."""
    mark = f"hostname fleetrl-n{node} "  # in the node's start-up script (`ip netns exec` has exec'd unshare)
    for process in psutil.Process(driver_pid).children(recursive=True):
        try:
            if process.name() == "unshare" and any(mark in arg for arg in process.cmdline()):
                return process.children()[0]
        except (psutil.Error, IndexError):
            continue
    raise AssertionError(f"no running simulated node {node} of driver {driver_pid}")


def wait_for_output(running, text: str, timeout_s: float) -> None:
    """Until the run's stderr shows `text`; fail (the run is then killed by its `with`) if it
    ends or `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while text not in running.stderr_so_far():
        if running.process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the run never printed {text!r}; stderr:\n{running.stderr_so_far()[-3000:]}", pytrace=False)
        time.sleep(0.5)


def on_node(init_pid: int, *command: str) -> str:
    """Run `command` inside the mount and network namespaces of the node whose PID-namespace init
    is `init_pid` (its own /tmp, its own interfaces); its stdout."""
    inside = ["nsenter", f"--target={init_pid}", "--mount", "--net", "--"]
    return subprocess.run([*inside, *command], capture_output=True, text=True, check=True).stdout


def fill_node_tmp(init_pid: int, used_percent: float) -> None:
    """Fill the /tmp of the node whose PID-namespace init is `init_pid` (inside its own mount
    namespace) until `used_percent` of it is used: the seed's '/tmp/ray ... is over 95% full'.
    `/tmp/ballast` holds it."""
    size, avail = map(int, on_node(init_pid, "df", "-B1", "--output=size,avail", "/tmp").split()[-2:])
    ballast = avail - int(size * (100 - used_percent) / 100)
    on_node(init_pid, "fallocate", "-l", str(ballast), "/tmp/ballast")


@contextlib.contextmanager
def unroutable_interface(netns: str, name: str, address: str):
    """A second interface in namespace `netns` holding `address`, which no other namespace routes
    to (a veth pair with both ends inside `netns`: this kernel may lack the dummy type); deleted
    on leaving, its pair with it."""
    subprocess.run(["ip", "-n", netns, "link", "add", name, "type", "veth", "peer", "name", f"{name}p"], check=True)
    try:
        for args in (["addr", "add", f"{address}/32", "dev", name], ["link", "set", name, "up"]):
            subprocess.run(["ip", "-n", netns, *args], check=True)
        yield
    finally:
        subprocess.run(["ip", "-n", netns, "link", "del", name], check=True)


def listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) of each TCP socket process `pid` listens on, read in its own network
    namespace (/proc/<pid>/net/tcp and tcp6: psutil reads the caller's); empty once it is gone."""
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return set()
    inodes = {link[len("socket:[") : -1] for link in links if link.startswith("socket:[")}
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            rows = [line.split() for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if row[3] == "0A" and row[9] in inodes:  # LISTEN, one of its own sockets
                address, port = row[1].split(":")
                raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
                ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add((socket.inet_ntop(family, ordered), int(port, 16)))
    return found


def fleetrl_processes(supervisor_pid: int) -> dict[int, str]:
    """pid → role of each process of the run that runs fleetrl's code: the supervisor, the
    controller, and the Ray workers hosting fleetrl's workers (FLEETRL_COMPONENT in their
    environment), in whichever namespace; not Ray's own daemons."""
    found = {supervisor_pid: "supervisor"}
    for process in psutil.Process(supervisor_pid).children(recursive=True):
        try:
            if "fleetrl.controller" in process.cmdline():
                found[process.pid] = "controller"
            elif (component := process.environ().get("FLEETRL_COMPONENT")) is not None:
                found[process.pid] = f"{component} rank {process.environ().get('FLEETRL_RANK')}"
        except psutil.Error:
            continue
    return found
