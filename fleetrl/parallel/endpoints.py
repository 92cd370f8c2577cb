"""Where each actor rank can be reached, as it tells its peers: kept in the rendezvous store.

The rendezvous (the store at rank 0's node) can succeed while the full mesh after it fails: each
rank advertises the address of the interface GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME) names, or
the one its host name resolves to, and a peer with no route to it gets "connect: Network is
unreachable" — a message that names neither end. Each rank writes its own end into the store
before the mesh, so the rank that fails names both: itself and every peer, with node, host,
interface and address.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass

KEY = "fleetrl/endpoint/{rank}"


@dataclass(frozen=True)
class Endpoint:
    rank: int
    node: str  # fleetrl's node index (FLEETRL_NODE_RANK), else the host name
    host: str
    variable: str  # GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME
    interface: str  # its value ("" when unset)
    address: str  # what the interface holds, or the host name's address

    def __str__(self) -> str:
        if self.interface:
            where = f"{self.address} on interface {self.interface} ({self.variable}={self.interface})"
        else:
            where = f"{self.address}, its host name's address ({self.variable} unset)"
        return f"actor rank {self.rank} on node {self.node} ({self.host}) at {where}"


def this_endpoint(rank: int, backend: str) -> Endpoint:
    variable = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    interface = os.environ.get(variable, "").strip()
    host = socket.gethostname()
    address = interface_address(interface.split(",")[0]) if interface else host_address(host)
    return Endpoint(rank, os.environ.get("FLEETRL_NODE_RANK") or host, host, variable, interface, address)


def interface_address(name: str) -> str:
    import psutil

    addresses = [a.address for a in psutil.net_if_addrs().get(name, []) if a.family == socket.AF_INET]
    return addresses[0] if addresses else "no IPv4 address"


def host_address(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as error:
        return f"unresolved ({error})"


def publish(store, endpoint: Endpoint) -> None:
    """`store`: the process group's rendezvous store (torch.distributed.Store)."""
    store.set(KEY.format(rank=endpoint.rank), json.dumps(asdict(endpoint)))


def peers(store, rank: int, world_size: int) -> list[Endpoint]:
    """The endpoints the other ranks published so far (without waiting for the rest)."""
    found = []
    for other in range(world_size):
        key = KEY.format(rank=other)
        if other != rank and store.check([key]):
            found.append(Endpoint(**json.loads(store.get(key))))
    return found
