"""Ray's nodes as fleetrl names them: whether Ray resolves 'this node' to the loopback address,
and which Ray node is fleetrl's node i.

`set_ray_loopback` is one switch, set before Ray is imported, that every way of starting or
joining Ray (the run's cluster, the controller's early start, the doctor's join, a sweep) goes
through; `in_node_order` orders the entries of `ray.nodes()` on a cluster fleetrl joined
(`cluster.ray_address`), for the backend and the doctor alike. A module of its own, torch- and
Ray-free, so that it imports nothing of Ray's and nothing of fleetrl's that does."""

from __future__ import annotations

import os
import sys

from fleetrl.net import is_loopback


def set_ray_loopback(on: bool) -> None:
    """Whether Ray resolves 'this node' to the loopback address, in this process and the raylets
    and workers it starts (they inherit the variable); set on every start, whatever an earlier run
    in this process (or a parent) chose. On: without it Ray rewrites 127.0.0.1 in a cluster address
    to the machine's external address, where no raylet listens, and `ray.init` waits forever. Off:
    a cluster whose nodes are on other addresses must resolve this node to its real address, or the
    driver registers at 127.0.0.1 and the remote workers it owns are dropped at creation. The
    variable is read when Ray is imported: set it before (an imported Ray is set directly)."""
    if on:
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    else:
        os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    if "ray" in sys.modules:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = not on and not ray_constants.IS_WINDOWS_OR_OSX


def joins_loopback(ray_address: str) -> bool:
    """Whether `cluster.ray_address` (host:port) is a Ray instance on this machine's loopback."""
    return is_loopback(ray_address.rpartition(":")[0].strip("[]"))


def in_node_order(nodes: list[dict]) -> list[dict]:
    """The alive nodes in fleetrl's node order: the head first, then the others by address. A
    node offering neither CPU nor GPU (a head started with `--num-cpus=0`, as is common, or an
    isolated simulation's) can hold no rank, so it gets no index."""
    usable = [n for n in nodes if n.get("Alive") and (n["Resources"].get("CPU", 0) or n["Resources"].get("GPU", 0))]
    usable.sort(key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"], n["NodeID"]))
    return usable
