"""Addresses and ports on this machine: the one home of the small networking facts the actor's
process group, the heartbeat store, the Ray cluster, the supervisor and the doctor all need (so it
sits below every package that listens).

Torch-free on purpose: the doctor imports it at start-up, when nothing heavy may load yet.
"""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 (a zone suffix such as '%lo' ignored) and 'localhost'."""
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return address == "localhost"


def loopback_interface() -> str | None:
    """The name of the interface holding 127.0.0.1 ('lo' on Linux, 'lo0' on macOS)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addresses):
            return name
    return None


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on `address` right now (for a rendezvous hosted on this machine).

    Raises OSError when `address` is not one of this machine's addresses."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def listening_socket(address: str, port: int = 0, backlog: int = 128) -> socket.socket:
    """A TCP socket listening on `address` alone. Raises OSError when `address` is not one of
    this machine's."""
    listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(backlog)
    except OSError:
        listener.close()
        raise
    return listener


def route_address(peer: str) -> str:
    """This machine's address on the route to `peer` (no packet is sent)."""
    with socket.socket(socket.AF_INET6 if ":" in peer else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, 9))
        return probe.getsockname()[0]
