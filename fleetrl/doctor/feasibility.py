"""Placement feasibility: the config's layout resolved, then held against the live resources.

`resolve_placement` catches a layout that is wrong on paper (a range beyond the cluster, a missing
component). This check adds what only the live cluster knows: whether the nodes and the devices
the layout counts on exist. A GPU rank on a device that is not there crashes at start; more CPU
slots than cores only runs slowly (workers ask Ray for no CPUs, so none waits for one).
"""

from __future__ import annotations

from fleetrl.doctor.context import Context
from fleetrl.doctor.resources import LiveCluster, live_cluster
from fleetrl.doctor.result import Check, failed, passed, skipped, warned
from fleetrl.errors import ConfigError
from fleetrl.plan.placement import Placement

NAME = "placement"


def check_placement(context: Context) -> list[Check]:
    view = context.view
    if view.component_placement is None:
        return [skipped(NAME, "no cluster.component_placement: every component runs in this process")]
    gpus = view.wants_cuda
    live = live_cluster(count_gpus=gpus)
    here = live.nodes[0]
    kind = "GPU" if gpus else "CPU slot"
    try:
        placement = view.placement(cpu_count=here.cpus)
    except ConfigError as error:
        return [failed(NAME, str(error), f"fix {error.key}; `fleetrl train --dry-run` prints the resolved layout")]
    per_node = placement.devices_per_node
    layout = (
        f"{placement.num_nodes} node(s) x {per_node} {kind}(s); "
        f"actor {placement.world_size('actor')}, rollout {placement.world_size('rollout')}, "
        f"env {placement.world_size('env')} rank(s)"
    )
    problem = missing_nodes(context, live) or short_devices(context, live, placement, gpus)
    if problem:
        status, text, remedy = problem
        return [status(NAME, f"{layout}, but {text}", remedy)]
    if live.whole_cluster:
        seen = f"{live.source} has {len(live.nodes)} node(s) with enough devices"
    else:
        seen = f"node {view.node} has {here.gpus if gpus else here.cpus} {kind}(s)"
        if view.remote_peers:
            seen += f"; the other {placement.num_nodes - 1} node(s) are not visible from here"
    return [passed(NAME, f"{layout}; {seen}")]


def missing_nodes(context: Context, live: LiveCluster):
    """(status, what is wrong, what to do) when the cluster has fewer nodes than the config."""
    view = context.view
    if live.whole_cluster and len(live.nodes) < view.num_nodes:
        return (
            failed,
            f"{live.source} has {len(live.nodes)} live node(s)",
            "start Ray on the missing node(s) (`ray start --address=<head>:6379`), or lower cluster.num_nodes",
        )
    if view.remote_peers and not live.whole_cluster and view.ray_address is None:
        return (
            failed,
            "neither cluster.ray_address nor cluster.simulate_nodes is set, so "
            "fleetrl would start a one-node Ray cluster on this machine",
            "run `ray start --head` here and `ray start --address=<this node>:6379` on the "
            "others, then set cluster.ray_address; or set cluster.simulate_nodes to "
            "rehearse on this machine",
        )
    return None


def needs(placement: Placement, node: int, gpus: bool) -> int:
    """GPUs a node must have (its highest local device + 1), or the CPU slots it uses (cores:
    collocated components share a slot, as they would share a GPU)."""
    ranks = [a for a in placement.assignments if a.node == node]
    if gpus:
        return max((a.local_device + 1 for a in ranks), default=0)
    return len({a.local_device for a in ranks})


def short_devices(context: Context, live: LiveCluster, placement: Placement, gpus: bool):
    """(status, what is missing, what to do) when a node has fewer devices than the layout uses."""
    view = context.view
    if live.whole_cluster:  # Ray's nodes in fleetrl's node order: the head first, then by address
        pairs = [(node, live.nodes[node]) for node in range(placement.num_nodes)]
    elif view.simulated:  # every simulated node's processes share this machine
        pairs = [(None, live.nodes[0])]
    else:
        pairs = [(view.node, live.nodes[0])]
    short = []
    for node, machine in pairs:
        need = (
            sum(needs(placement, n, gpus) for n in range(placement.num_nodes))
            if node is None
            else needs(placement, node, gpus)
        )
        have = machine.gpus if gpus else machine.cpus
        if have < need:
            unit = "GPU(s)" if gpus else "CPU(s)"
            if node is None:
                short.append(
                    f"the {placement.num_nodes} simulated nodes use {need} {unit} of this machine, which has {have}"
                )
            else:
                short.append(f"node {node} ({machine.address}) uses {need} {unit} and has {have}")
    if not short:
        return None
    text = "; ".join(short) + (f" ({live.source})" if live.whole_cluster else "")
    if gpus:
        return (
            failed,
            text,
            "make the GPUs visible (CUDA_VISIBLE_DEVICES), lower "
            "cluster.devices_per_node, or move the ranks to devices that exist; "
            "a rank on a missing GPU crashes at start",
        )
    return (
        warned,
        text,
        "the run starts, but its ranks share the cores and run slower; use "
        "fewer CPU slots per node (cluster.component_placement) to avoid that",
    )
