"""TCP reachability: can this node open a connection to each peer it will talk to?

Gloo's connectFullMesh needs every rank to connect to every other; a firewall or a wrong address
makes it wait out its whole timeout (30 minutes by default) before failing. A refused or silent
connect here costs at most `connect_timeout` seconds and names the address and port.
"""

from __future__ import annotations

import errno
import socket
import time
from dataclasses import dataclass

from fleetrl.doctor.cluster_view import Endpoint, parse_endpoint
from fleetrl.doctor.context import Context
from fleetrl.doctor.interfaces import advertised_address
from fleetrl.doctor.result import Check, failed, passed, warned


@dataclass(frozen=True)
class Probe:
    host: str
    port: int
    ok: bool
    seconds: float
    error: str = ""  # why the connection failed, in words

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def probe(host: str, port: int, timeout: float) -> Probe:
    """Open (and close) one TCP connection to host:port, waiting at most `timeout` seconds."""
    start = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as error:
        return Probe(host, port, False, time.monotonic() - start, explain(error, timeout))
    return Probe(host, port, True, time.monotonic() - start)


def explain(error: OSError, timeout: float) -> str:
    if isinstance(error, socket.timeout):
        return f"no answer within {timeout:g} s (the host is down, or a firewall drops the packets)"
    if isinstance(error, socket.gaierror):
        return f"the name does not resolve ({error.strerror or error})"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (nothing listens on that port, or a firewall rejects it)"
    if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"no route to the host ({error.strerror})"
    return str(error.strerror or error)


def probe_self(host: str, timeout: float) -> Probe:
    """Listen on host (an ephemeral port) and connect to it from this process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.bind((host, 0))
        listener.listen(1)
    except OSError as error:
        return Probe(host, 0, False, 0.0, f"cannot listen on {host}: {error.strerror or error}")
    with listener:
        return probe(host, listener.getsockname()[1], timeout)


def targets(context: Context) -> list[tuple[str, Endpoint]]:
    """(who, endpoint) for every peer this node must reach: the Ray head, then --peer ones."""
    view = context.view
    found = []
    head = view.ray_head()
    if head is not None:
        found.append(("the Ray head (cluster.ray_address)", head))
    found += [(f"peer {text}", parse_endpoint(text)) for text in context.options.peers]
    return found


def check_reachability(context: Context) -> list[Check]:
    view, options = context.view, context.options
    name = "network.reachability"
    here = f"node {view.node}"
    advertised = advertised_address(context).address if view.remote_peers else "127.0.0.1"
    own = probe_self(advertised, options.connect_timeout)
    if own.ok:
        checks = [passed(name, f"{here} → itself at {own.target}: connected in {own.seconds * 1000:.1f} ms")]
    else:
        checks = [
            failed(
                name,
                f"{here} → itself at {own.target}: {own.error}",
                f"check the firewall of {here} for {advertised} and that the address belongs to this machine",
            )
        ]
    peers = targets(context)
    for who, endpoint in peers:
        if endpoint.port is None:
            checks.append(
                warned(name, f"{here} → {who} at {endpoint.host}: no port to try", "write the address as host:port")
            )
            continue
        result = probe(endpoint.host, endpoint.port, options.connect_timeout)
        if result.ok:
            checks.append(
                passed(name, f"{here} → {who} at {result.target}: connected in {result.seconds * 1000:.1f} ms")
            )
        else:
            checks.append(
                failed(
                    name,
                    f"{here} → {who} at {result.target}: unreachable, {result.error} after {result.seconds:.2f} s",
                    f"make {result.target} reachable from {here}: is the process there running, "
                    f"is the address right, does a firewall or security group allow the port?",
                )
            )
    if view.remote_peers and not peers:
        checks.append(
            warned(
                name,
                f"the cluster has {view.num_nodes} nodes but no peer address is known here "
                f"(no cluster.ray_address, no --peer), so only this node was tried",
                "set cluster.ray_address to the Ray head's host:port, or pass --peer host:port for each other node",
            )
        )
    return checks
