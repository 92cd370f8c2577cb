"""Where the supervisor's heartbeat store listens: on the address its workers reach it at, never
on every interface (docs/concepts/security.md)."""

from __future__ import annotations

from fleetrl.cluster.isolation.bridge import build_bridge
from fleetrl.cluster.ray.nodes import joins_loopback
from fleetrl.config.schema import ClusterConfig
from fleetrl.net import is_loopback, route_address


def store_address(cluster: ClusterConfig, inline: bool, controller_pid: int) -> str:
    """Where the supervisor's store listens for the run on `cluster`, whose controller is process
    `controller_pid` (started, waiting for its orders): loopback when every worker is on this
    machine (`inline`, or Ray started here on loopback or joined there); `cluster.node_ip` for a
    Ray started here on another address; this machine's address towards the head of a Ray cluster
    it joins; for isolated simulated nodes, the controller's address on the bridge they are
    joined over — built here, before the store listens on it, for the controller to adopt
    (cluster/isolation/bridge.py)."""
    if inline:
        return "127.0.0.1"
    if cluster.ray_address is not None:
        if joins_loopback(cluster.ray_address):
            return "127.0.0.1"
        return route_address(cluster.ray_address.rpartition(":")[0].strip("[]"))
    if cluster.simulate_nodes > 1 and cluster.simulate_isolation == "namespaces":
        return build_bridge(controller_pid).host_address
    return "127.0.0.1" if is_loopback(cluster.node_ip) else cluster.node_ip
