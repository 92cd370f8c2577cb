"""Simulated nodes that do not share a host: `cluster.simulate_isolation: namespaces`.

Each simulated node is a `ray start --block` inside its own network namespace (one veth into a
private bridge: its own address and interface names, no route anywhere else), its own PID
namespace (its init is the node: kill it and the whole "machine" is gone), its own mount
namespace (a private tmpfs on /tmp and /dev/shm, its own /etc/hosts), its own UTS hostname, and
optionally a wall clock offset (`skewed_clock`: every Python process of the node, Ray's and
fleetrl's, reads a wall clock that far off). The Ray head runs in the root namespace on the bridge's own address with no CPUs: the
controller's node, reached by the workers the way a real cluster reaches its head. The bridge is
the one the supervisor built for this controller, where there is one (cluster/isolation/bridge.py: the
run's heartbeat store listens on it too, and outlives these nodes), else one built here.

Traffic stays on one private /24 that only this bridge holds. Everything made here carries the
controller's pid in its name (`fleetrl-<pid>-n<i>` namespaces, `frl<pid>...` links,
`/var/tmp/fleetrl-iso-<pid>`, outside the nodes' private /tmp), is undone in reverse on success and on any failure, and a later start
sweeps what a killed run left behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import psutil

from fleetrl.cluster.isolation.bridge import build_bridge, existing_bridge, ip, remove_bridge
from fleetrl.cluster.ray.worker_path import NODE_PATHS_VARIABLE, node_paths
from fleetrl.net import free_port
from fleetrl.probe.child_activity import starting_ray
from fleetrl.teardown import kill_tree, wait_ended

log = logging.getLogger("fleetrl")

NETNS_PATTERN = re.compile(r"^fleetrl-(\d+)-n\d+$")
LINK_PATTERN = re.compile(r"^frl(\d+)[bh]\d*$")
WORK_DIR_PATTERN = re.compile(r"^fleetrl-iso-(\d+)$")
# In the environment of every process of a simulated cluster (its daemons, and the Ray workers
# they start): the cluster's tag, so what one cluster left is told from any other's by process.
CLUSTER_MARK = "FLEETRL_ISOLATED_CLUSTER"
WORK_ROOT = Path("/var/tmp")  # the run's folder: hosts file, logs, clocks, the head's Ray temp dir
OBJECT_STORE_BYTES = 200 * 1024 * 1024


@dataclass
class IsolatedNode:
    index: int
    netns: str
    address: str
    hostname: str
    process: subprocess.Popen  # `unshare` in the root PID namespace; its one child is the node's init

    def init_pid(self) -> int:
        """The root-namespace pid of the node's PID-namespace init (`ray start --block`)."""
        children = psutil.Process(self.process.pid).children()
        if not children:
            raise RuntimeError(f"simulated node {self.index} ({self.netns}) has no init process any more")
        return children[0].pid


class IsolatedNodes:
    """The running isolated cluster: `address` is the head's GCS, `host_address` the controller's
    address on the bridge, `nodes[i]` simulated node i."""

    def __init__(
        self, num_nodes: int, cpus_per_node: int, clock_skew_s: dict[int, float] | None = None, tmp_size: str = "2g"
    ):
        """`tmp_size`: each node's /tmp and /dev/shm tmpfs (memory is taken only as it is written)."""
        self.tag = str(os.getpid())
        self.work_dir = WORK_ROOT / f"fleetrl-iso-{self.tag}"
        self.nodes: list[IsolatedNode] = []
        self.head: subprocess.Popen | None = None
        self.undo = contextlib.ExitStack()
        with self.undo:
            sweep_stale()
            self.work_dir.mkdir(exist_ok=False)
            self.undo.callback(shutil.rmtree, self.work_dir, True)
            bridge = existing_bridge(self.tag)
            if bridge is None:  # no supervisor built one: this process's, removed with its nodes
                bridge = build_bridge(self.tag)
                self.undo.callback(remove_bridge, bridge.name)
            self.bridge, self.host_address, subnet = bridge.name, bridge.host_address, bridge.subnet
            addresses = [str(subnet[10 + i]) for i in range(num_nodes)]
            hosts = self.hosts_file(addresses)
            port = free_port(self.host_address)
            self.address = f"{self.host_address}:{port}"
            self.start_head(port)
            for index, address in enumerate(addresses):
                skew = (clock_skew_s or {}).get(index, 0.0)
                self.nodes.append(
                    self.start_node(index, address, subnet.prefixlen, cpus_per_node, hosts, skew, tmp_size)
                )
            self.undo = self.undo.pop_all()  # keep all of it until shutdown()

    def hosts_file(self, addresses: list[str]) -> Path:
        """Every node resolves every node's hostname (and its own) to its bridge address, as a
        real cluster's DNS would: Gloo binds the address its host name resolves to."""
        lines = ["127.0.0.1 localhost", f"{self.host_address} fleetrl-head"]
        lines += [f"{address} fleetrl-n{i}" for i, address in enumerate(addresses)]
        path = self.work_dir / "hosts"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start_head(self, port: int) -> None:
        command = [
            *ray_command(),
            "--head",
            "--include-dashboard=false",
            f"--node-ip-address={self.host_address}",
            f"--port={port}",
            "--num-cpus=0",
            f"--temp-dir={self.work_dir / 'ray'}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
        ]
        with starting_ray():  # Ray's, not a simulator's (probe/child_activity.py)
            self.head = subprocess.Popen(
                command,
                env=ray_environment(self.tag),
                start_new_session=True,
                stdout=self.log_file("head"),
                stderr=subprocess.STDOUT,
            )
        self.undo.callback(stop_process_tree, self.head)
        wait_for_port(self.host_address, port, self.head, self.work_dir / "head.log")

    def start_node(
        self, index: int, address: str, prefixlen: int, cpus: int, hosts: Path, skew_s: float, tmp_size: str
    ) -> IsolatedNode:
        netns, host_end = f"fleetrl-{self.tag}-n{index}", f"frl{self.tag}h{index}"
        ip("netns", "add", netns)
        self.undo.callback(delete_netns, netns)
        ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", netns)
        self.undo.callback(ip, "link", "del", host_end, check=False)
        ip("link", "set", host_end, "master", self.bridge, "up")
        for args in (("addr", "add", f"{address}/{prefixlen}", "dev", "eth0"), ("link", "set", "eth0", "up")):
            ip("-n", netns, *args)
        ip("-n", netns, "link", "set", "lo", "up")
        hostname = f"fleetrl-n{index}"
        clock = skewed_clock(self.work_dir / f"clock-n{index}", skew_s) if skew_s else None
        ray = [
            *ray_command(),
            f"--address={self.address}",
            f"--node-ip-address={address}",
            f"--num-cpus={cpus}",
            "--temp-dir=/tmp/ray",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
        ]
        private_tmp = private_tmp_commands(self.work_dir / f"host-tmp-n{index}", tmp_size)
        inside = (
            f"mount --bind {hosts} /etc/hosts && {private_tmp} && "
            f"mount -t tmpfs -o size={tmp_size} fleetrl-shm /dev/shm && hostname {hostname} && exec " + " ".join(ray)
        )
        command = ["ip", "netns", "exec", netns, "unshare", "--pid", "--fork", "--mount-proc", "--uts"]
        command += ["--kill-child", "sh", "-c", inside]
        with starting_ray():  # Ray's, not a simulator's (probe/child_activity.py)
            process = subprocess.Popen(
                command,
                env=ray_environment(self.tag, clock),
                start_new_session=True,
                stdout=self.log_file(f"n{index}"),
                stderr=subprocess.STDOUT,
            )
        self.undo.callback(stop_process_tree, process)
        log.info("simulated node %d: %s in %s, hostname %s%s", index, address, netns, hostname, skew_note(skew_s))
        return IsolatedNode(index, netns, address, hostname, process)

    def log_file(self, name: str):
        handle = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the cluster)
        self.undo.callback(handle.close)
        return handle

    def node_ids(self, timeout_s: float = 60) -> list[str]:
        """Ray node id of each simulated node, in order, once all have joined (after `ray.init`)."""
        import ray

        deadline = time.monotonic() + timeout_s
        while True:
            by_address = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
            missing = [node for node in self.nodes if node.address not in by_address]
            if not missing:
                return [by_address[node.address] for node in self.nodes]
            dead = [node for node in missing if node.process.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "; ".join(f"{self.work_dir / f'n{n.index}.log'}" for n in missing)
                raise RuntimeError(
                    f"simulated node(s) {[n.index for n in missing]} did not join the Ray cluster at "
                    f"{self.address} ({'exited' if dead else f'within {timeout_s:g} s'}); see {logs}"
                )
            time.sleep(0.2)

    def wait_started(self, timeout_s: float = 120) -> None:
        """Until every node's `ray start` says its runtime started (for a caller not connected
        to Ray, e.g. a test that then points fleetrl at `address` as at a real cluster)."""
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            log_path = self.work_dir / f"n{node.index}.log"
            while "Ray runtime started" not in log_path.read_text(errors="replace"):
                if node.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"simulated node {node.index} did not start; see {log_path}")
                time.sleep(0.2)

    def shutdown(self) -> None:
        self.undo.close()

    def __enter__(self) -> IsolatedNodes:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()


def private_tmp_commands(stash: Path, tmp_size: str) -> str:
    """Shell commands, inside a node's mount namespace, that give it a /tmp of its own while keeping
    what the node's processes must still read from this machine's /tmp: the Python environment and
    the code on sys.path, when they live there (a checkout or venv under /tmp, as CI may have). Each
    such top-level entry is bind-mounted aside, the private tmpfs mounted, and the entry bound back."""
    kept = sorted(
        {
            real.parts[2]
            for path in (sys.prefix, sys.executable, os.getcwd(), *sys.path)
            if path and (real := Path(os.path.realpath(path))).parts[:2] == ("/", "tmp") and len(real.parts) > 2
        }
    )
    aside = [f"mkdir -p {shlex.quote(str(stash / name))}" for name in kept]
    aside += [f"mount --bind {shlex.quote('/tmp/' + name)} {shlex.quote(str(stash / name))}" for name in kept]
    back = [f"mkdir -p {shlex.quote('/tmp/' + name)}" for name in kept]
    back += [f"mount --bind {shlex.quote(str(stash / name))} {shlex.quote('/tmp/' + name)}" for name in kept]
    return " && ".join([*aside, f"mount -t tmpfs -o size={tmp_size} fleetrl-tmp /tmp", *back])


def wait_for_port(address: str, port: int, process: subprocess.Popen, log_path: Path, timeout_s: float = 60) -> None:
    """Until the head's GCS accepts connections (fail if it exits or takes over `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the simulated cluster's Ray head did not start at {address}:{port}; see {log_path}")


def ray_environment(tag: str, clock: Path | None = None) -> dict[str, str]:
    """The environment of a node's Ray daemons, marked with the cluster's `tag`. Ray turns token
    authentication on for a cluster on a non-loopback address; these nodes reach only each other,
    so it stays off as on 127.0.0.1."""
    variables = {**os.environ, "RAY_AUTH_MODE": "disabled", CLUSTER_MARK: tag}
    variables.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # set for loopback-only runs: not for nodes
    if clock is not None:  # its sitecustomize on the path of the node's daemons, and of fleetrl's workers there
        variables["PYTHONPATH"] = os.pathsep.join(filter(None, [str(clock), os.environ.get("PYTHONPATH")]))
        variables[NODE_PATHS_VARIABLE] = node_paths(str(clock))
    return variables


def ray_command() -> list[str]:
    ray = Path(sys.executable).with_name("ray")
    return [str(ray), "start", "--block", "--disable-usage-stats"]


def skewed_clock(folder: Path, skew_s: float) -> Path:
    """A folder holding a `sitecustomize` that puts every Python process that has it on its path
    `skew_s` seconds off on the wall clock (time.time, time.time_ns), the monotonic clock left
    alone, as on a real machine whose clock is off. (Debian's libfaketime 0.9.10 cannot serve:
    under it Python 3.11's sleeps fail with EINVAL or its timed waits hang.)"""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import time\n"
        f"_skew_s = {float(skew_s)!r}\n"
        "_time, _time_ns = time.time, time.time_ns\n"
        "time.time = lambda: _time() + _skew_s\n"
        "time.time_ns = lambda: _time_ns() + int(_skew_s * 1e9)\n"
    )
    return folder


def skew_note(skew_s: float) -> str:
    return f", clock {skew_s:+g} s" if skew_s else ""


def stop_process_tree(process: subprocess.Popen) -> None:
    """End a node (or the head) and everything under it; a node's PID namespace dies with its init."""
    kill_tree(process.pid, include_root=True, timeout_s=10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def delete_netns(netns: str) -> None:
    """Kill whatever still runs in the namespace, then delete it (its veth pair goes with it)."""
    found = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    wait_ended([p for p in map(existing, found) if p is not None], timeout_s=10)
    ip("netns", "del", netns, check=False)


def existing(pid: str) -> psutil.Process | None:
    try:
        return psutil.Process(int(pid))
    except psutil.Error:
        return None


def sweep_stale(drivers: Collection[int] | None = None) -> list[str]:
    """Remove what an earlier, killed run left (its pid in the names is not alive; one of
    `drivers`, where given): namespaces and whatever runs in them, links, work folders and the
    head's processes. Returns the names."""

    def stale(match: re.Match | None) -> bool:
        return (
            match is not None and (drivers is None or int(match[1]) in drivers) and not psutil.pid_exists(int(match[1]))
        )

    swept = []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    for name in (line.split()[0] for line in names if line.strip()):
        if stale(NETNS_PATTERN.match(name)):
            delete_netns(name)
            swept.append(name)
    for name in psutil.net_if_addrs():
        if stale(LINK_PATTERN.match(name)):
            ip("link", "del", name, check=False)
            swept.append(name)
    for folder in WORK_ROOT.glob("fleetrl-iso-*"):
        if stale(WORK_DIR_PATTERN.match(folder.name)):
            for process in psutil.process_iter(["cmdline"]):
                if str(folder) in " ".join(process.info["cmdline"] or []):
                    kill_tree(process.pid)
            shutil.rmtree(folder, ignore_errors=True)
            swept.append(str(folder))
    if swept:
        log.warning("removed what an earlier isolated simulation left behind: %s", ", ".join(swept))
    return swept
