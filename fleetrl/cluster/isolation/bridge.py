"""The private bridge that isolated simulated nodes are joined over (cluster/isolation/nodes.py),
and who builds it.

The bridge holds the controller's address on the nodes' own /24 (`host_address`): the Ray head
listens there, and so does the run's heartbeat store, since every listener binds the interface its
peers use (docs/concepts/security.md). Under `fleetrl train` the store belongs to the supervisor
and must listen before the controller is told where it is (a TCPStore's own client connects to
its address at once), so the supervisor builds the bridge between starting the controller and
handing it its orders (supervise/store_address.py), and the controller's `IsolatedNodes` adopts
it. A `Trainer` used as a library builds its own, and opens its store on it afterwards.

Either way the bridge is named for the controller's pid (`frl<pid>b`), like everything of its
simulated nodes: removed with them, or — adopted, as the controller's store must outlive its
nodes — by the sweep of what a controller no longer running left (`isolated_nodes.sweep_stale`).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
from dataclasses import dataclass

import psutil

SUBNET_PREFIX = "10.213"  # one /24 of 10.213.0.0/16 per run: 10.213.<k>.0/24


@dataclass(frozen=True)
class Bridge:
    name: str
    interface: ipaddress.IPv4Interface  # the controller's address on it, with the nodes' /24

    @property
    def host_address(self) -> str:
        return str(self.interface.ip)

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return self.interface.network


def bridge_name(tag: str | int) -> str:
    """The bridge of the controller whose pid is `tag`."""
    return f"frl{tag}b"


def build_bridge(tag: str | int) -> Bridge:
    """A new bridge for controller `tag` on a free /24, holding its first address, up."""
    subnet = free_subnet()
    bridge = Bridge(bridge_name(tag), ipaddress.IPv4Interface(f"{subnet[1]}/{subnet.prefixlen}"))
    ip("link", "add", bridge.name, "type", "bridge")
    try:
        ip("addr", "add", str(bridge.interface), "dev", bridge.name)
        ip("link", "set", bridge.name, "up")
    except RuntimeError:
        remove_bridge(bridge.name)
        raise
    return bridge


def existing_bridge(tag: str | int) -> Bridge | None:
    """The bridge built for controller `tag` (by its supervisor), if there is one."""
    name = bridge_name(tag)
    for address in psutil.net_if_addrs().get(name, []):
        if address.family == socket.AF_INET:
            return Bridge(name, ipaddress.IPv4Interface(f"{address.address}/{address.netmask}"))
    return None


def remove_bridge(name: str) -> None:
    """Delete bridge `name` (nothing if it is gone); the nodes' links on it go with it."""
    ip("link", "del", name, check=False)


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.<k>.0/24 that no interface of this machine is on."""
    taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    start = os.getpid() % 256
    for k in (*range(start, 256), *range(start)):
        subnet = ipaddress.ip_network(f"{SUBNET_PREFIX}.{k}.0/24")
        if f" {SUBNET_PREFIX}.{k}." not in taken:
            return subnet
    raise RuntimeError(f"no free /24 left in {SUBNET_PREFIX}.0.0/16 for simulated nodes")


def ip(*args: str, check: bool = True) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed: {result.stderr.strip()}")
