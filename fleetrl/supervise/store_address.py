"""Where the supervisor's heartbeat store listens: on the address its workers reach it at, never
on every interface but where that address does not exist yet (docs/concepts/security.md)."""

from __future__ import annotations

from fleetrl.cluster.ray_loopback import joins_loopback
from fleetrl.config.schema import ClusterConfig
from fleetrl.net import ALL_IPV4, is_loopback, route_address


def store_address(cluster: ClusterConfig, inline: bool) -> str:
    """Where the supervisor's store listens for the run on `cluster`:
    loopback when every worker is on this machine (`inline`, or Ray started here on loopback or
    joined there); `cluster.node_ip` for a Ray started here on another address; this machine's
    address towards the head of a Ray cluster it joins. The one exception: isolated simulated
    nodes reach this machine through a bridge the controller builds after the store must listen
    (a TCPStore's own client connects to its address at once), so there it listens on every IPv4
    address (its values still sealed); workers are told the bridge's address."""
    if inline:
        return "127.0.0.1"
    if cluster.ray_address is not None:
        if joins_loopback(cluster.ray_address):
            return "127.0.0.1"
        return route_address(cluster.ray_address.rpartition(":")[0].strip("[]"))
    if cluster.simulate_nodes > 1 and cluster.simulate_isolation == "namespaces":
        return ALL_IPV4
    return "127.0.0.1" if is_loopback(cluster.node_ip) else cluster.node_ip
