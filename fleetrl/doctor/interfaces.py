"""The address each rank will advertise, and the interfaces GLOO/NCCL_SOCKET_IFNAME name.

Gloo binds, and tells its peers, the address of GLOO_SOCKET_IFNAME's interface when that is set;
otherwise the address the hostname resolves to, falling back to 127.0.0.1. On a machine whose
/etc/hosts maps the hostname to 127.0.1.1 that is a loopback address: fine on one node, and on two
nodes the other node dials its own loopback and "Gloo connectFullMesh failed" after a long wait.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, replace
from typing import Any

import psutil

from fleetrl.doctor.context import Context
from fleetrl.doctor.on_nodes import START_UP_S, live_nodes, on_every_node
from fleetrl.doctor.options import DoctorOptions
from fleetrl.doctor.resources import ray_connected
from fleetrl.doctor.result import Check, failed, passed, skipped, warned
from fleetrl.net import free_port, is_loopback


@dataclass(frozen=True)
class Interface:
    name: str
    addresses: tuple[str, ...]  # IPv4 first, then IPv6
    up: bool

    @property
    def loopback(self) -> bool:
        return bool(self.addresses) and all(is_loopback(a) for a in self.addresses)


def interfaces() -> dict[str, Interface]:
    """This machine's network interfaces, by name."""
    stats = psutil.net_if_stats()
    table = {}
    for name, entries in psutil.net_if_addrs().items():
        v4 = [e.address for e in entries if e.family == socket.AF_INET]
        v6 = [e.address for e in entries if e.family == socket.AF_INET6]
        table[name] = Interface(name, tuple(v4 + v6), bool(stats.get(name) and stats[name].isup))
    return table


def describe(table: dict[str, Interface], routable_only: bool = False) -> str:
    names = [i for i in table.values() if i.up and i.addresses and not (routable_only and i.loopback)]
    return ", ".join(f"{i.name} ({i.addresses[0]})" for i in names) or "none"


def resolve_hostname(timeout: float) -> tuple[str, list[str], str]:
    """(hostname, its addresses, error) — resolved in a thread, so a dead DNS cannot hang us."""
    hostname = socket.gethostname()
    found: dict = {}

    def resolve():
        try:
            infos = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
            found["addresses"] = list(dict.fromkeys(info[4][0] for info in infos))
        except OSError as error:
            found["error"] = str(error)

    thread = threading.Thread(target=resolve, daemon=True, name="doctor-resolve-hostname")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return hostname, [], f"no answer within {timeout:g} s"
    return hostname, found.get("addresses", []), found.get("error", "")


def bindable(address: str) -> bool:
    """Whether `address` is one of this machine's (a port can be bound on it)."""
    try:
        free_port(address)
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Advertised:
    address: str
    how: str  # where the address comes from, for the report


def advertised_address(context: Context) -> Advertised:
    """The address Gloo on this node will bind and send to its peers."""
    env = context.view.env_for_node()
    names = [n for n in env.get("GLOO_SOCKET_IFNAME", "").split(",") if n.strip()]
    table = interfaces()
    note = ""
    if names:
        interface = table.get(names[0].strip())
        if interface and interface.addresses:
            return Advertised(interface.addresses[0], f"interface {interface.name} (GLOO_SOCKET_IFNAME)")
        note = f"; GLOO_SOCKET_IFNAME={names[0]} is no usable interface here, so Gloo will fail"
    hostname, addresses, error = resolve_hostname(context.options.connect_timeout)
    for address in addresses:
        if bindable(address):
            return Advertised(address, f"hostname '{hostname}' resolves to it{note}")
    reason = error or f"none of {addresses} is an address of this machine"
    return Advertised(
        "127.0.0.1", f"fallback: hostname '{hostname}' does not resolve to an address of this machine ({reason}){note}"
    )


def check_advertised(context: Context) -> Check:
    name = "network.advertised_address"
    view = context.view
    advertised = advertised_address(context)
    if not view.remote_peers:
        where = "single node" if view.num_nodes == 1 else f"{view.num_nodes} simulated nodes, all on this machine"
        return passed(
            name, f"{where}: the ranks meet locally; Gloo would advertise {advertised.address} ({advertised.how})"
        )
    table = interfaces()
    others = other_nodes(view.num_nodes, view.node)
    if is_loopback(advertised.address) and not view.collectives_span_nodes():
        return warned(
            name,
            f"node {view.node} would advertise the loopback address "
            f"{advertised.address} ({advertised.how}); fine while the actor's "
            f"ranks share one machine, a hang once they span nodes",
            f"set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME on GPUs) in "
            f"cluster.env_vars to the interface that reaches {others}, one of: "
            f"{describe(table, routable_only=True)}",
        )
    if is_loopback(advertised.address):
        # Ray itself replaces a loopback node address with a routable one; Gloo does not.
        return failed(
            name,
            f"Gloo on node {view.node} would advertise the loopback address "
            f"{advertised.address} ({advertised.how}) to {others}, which cannot "
            f"reach it: the actor's process group hangs in connectFullMesh",
            f"set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME on GPUs) in "
            f"cluster.env_vars to the interface that reaches {others}, one of: "
            f"{describe(table, routable_only=True)}; or map the hostname to that "
            f"address in /etc/hosts",
        )
    local = {a for i in table.values() for a in i.addresses}
    if view.ray_address is None and view.node_ip and not is_loopback(view.node_ip) and view.node_ip not in local:
        return warned(
            name,
            f"cluster.node_ip is {view.node_ip}, which is not an address of this machine (it has {describe(table)})",
            "set cluster.node_ip to one of this machine's addresses",
        )
    return passed(name, f"node {view.node} advertises {advertised.address} ({advertised.how}) to {others}")


def other_nodes(num_nodes: int, node: int) -> str:
    indices = [str(n) for n in range(num_nodes) if n != node]
    return f"node{'s' if len(indices) > 1 else ''} {', '.join(indices)}"


def unused_because(context: Context, variable: str) -> str:
    """Why the variable does not matter for this config ('' when it does)."""
    view = context.view
    if variable.startswith("NCCL") and not view.wants_cuda:
        return "unused now: the config runs on CPU"
    if not view.uses_collectives():
        return "unused now: the actor has one rank"
    return ""


def usable(interface: Interface, view) -> str:
    """'' when Gloo/NCCL can use the interface, else why not."""
    if not interface.up:
        return f"interface {interface.name} is down"
    if not interface.addresses:
        return f"interface {interface.name} has no IP address"
    if interface.loopback and view.collectives_span_nodes():
        return f"interface {interface.name} is loopback, but the actor's ranks span nodes"
    return ""


def check_ifname(context: Context, variable: str, table: dict[str, Interface]) -> Check:
    """GLOO_SOCKET_IFNAME: comma-separated exact names, each must be usable. NCCL_SOCKET_IFNAME:
    prefixes ('eth' matches eth0), '=exact' names, or '^excluded' prefixes; NCCL needs one
    usable match."""
    name = f"network.{variable}"
    view = context.view
    value = view.env_for_node().get(variable, "").strip()
    source = view.env_var_source(variable)
    if not value:
        default = (
            "Gloo uses the hostname's address"
            if variable.startswith("GLOO")
            else "NCCL picks an interface itself (non-loopback, non-docker first)"
        )
        return skipped(name, f"unset: {default}")
    problems, matched = [], []
    if variable.startswith("NCCL") and value.startswith("^"):
        excluded = [p for p in value[1:].split(",") if p]
        left = [i for i in table.values() if not any(i.name.startswith(p) for p in excluded)]
        matched = [i.name for i in left if not usable(i, view)]
        if not matched:
            problems.append("it excludes every usable interface")
    else:
        exact = variable.startswith("GLOO") or value.startswith("=")
        for pattern in [p.strip() for p in value.lstrip("=").split(",") if p.strip()]:
            hits = [i for i in table.values() if (i.name == pattern if exact else i.name.startswith(pattern))]
            reasons = [usable(i, view) for i in hits]
            good = [f"{i.name} ({i.addresses[0]})" for i, why in zip(hits, reasons) if not why]
            if not hits:
                problems.append(f"no interface {'named' if exact else 'starting with'} '{pattern}'")
            elif exact or not good:
                problems += [why for why in reasons if why]
            matched += good
    detail = f"{variable}={value} (from {source})"
    if not problems:
        return passed(name, f"{detail}: {', '.join(matched)}")
    detail += f": {'; '.join(problems)}"
    if view.remote_peers:
        remedy = (
            f"set {variable} to the interface of node {view.node} that reaches "
            f"{other_nodes(view.num_nodes, view.node)}; this machine has "
            f"{describe(table, routable_only=True)}"
        )
    else:
        remedy = f"set {variable} to one of {describe(table)}, or unset it"
    unused = unused_because(context, variable)
    if unused:
        return warned(name, f"{detail} ({unused})", remedy)
    return failed(name, detail, remedy)


def check_network(context: Context) -> list[Check]:
    """Here, or, on a joined Ray cluster, on every node with that node's `cluster.env_vars`."""
    if ray_connected():
        return check_network_on_nodes(context)
    return check_network_here(context)


def check_network_here(context: Context) -> list[Check]:
    table = interfaces()
    return [
        check_advertised(context),
        *(check_ifname(context, variable, table) for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")),
    ]


def network_checks_on_node(node: int, config: Any, options: DoctorOptions) -> list[Check]:
    """Runs on node `node`: its interfaces, host name and configured variables."""
    return check_network_here(Context(config, replace(options, node=node)))


def check_network_on_nodes(context: Context) -> list[Check]:
    """What each node will advertise and bind, found on that node (`on_nodes.py`): a node with
    its own interfaces and /etc/hosts is invisible from the driver's machine."""
    checks = []
    nodes = live_nodes()
    for outcome in on_every_node(nodes, network_checks_on_node, (context.config, context.options), START_UP_S):
        if outcome.error:
            checks.append(outcome.did_not_run(f"network.node{outcome.index}"))
            continue
        for check in outcome.result:
            checks.append(
                replace(check, name=f"{check.name}.node{outcome.index}", detail=f"{outcome.source}: {check.detail}")
            )
    return checks
