"""The Gloo handshake between the actor's ranks where the placement puts them, on a joined cluster.

A handshake of ranks spawned on the driver's machine proves that machine's loopback, not the
mesh: the address each node advertises, its GLOO_SOCKET_IFNAME, the routes between the nodes.
Here each node that holds actor ranks gets one pinned task (`on_nodes.py`) that spawns its ranks
with that node's `cluster.env_vars`, rank 0 hosting the rendezvous at its node's address on a port
free there, as in a run; a rank that fails is named with its node, and its own error names the
peer it could not reach (`parallel/endpoints.py`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from fleetrl.doctor.cluster_view import ClusterView
from fleetrl.doctor.context import Context
from fleetrl.doctor.handshake import MODULE, check_gloo_here, rank_payloads, summarize
from fleetrl.doctor.on_nodes import START_UP_S, live_nodes, on_every_node
from fleetrl.doctor.processes import Outcome, run_probes
from fleetrl.doctor.resources import ray_connected
from fleetrl.doctor.result import Check, failed, passed
from fleetrl.net import free_port

NAME = "gloo.handshake"


def port_on_node(_node: int, host: str) -> int:
    return free_port(host)


def ranks_on_node(node: int, config: Any, payloads: dict[int, list[dict]], timeout: float) -> list[Outcome]:
    """Runs on node `node`: its ranks' probe processes (`payloads[node]`), with its variables
    and its index, as an actor rank placed there has them."""
    env = {**ClusterView(config, node=node).configured_env_vars(), "FLEETRL_NODE_RANK": str(node)}
    return run_probes(MODULE, payloads[node], deadline_s=timeout, env=env)


def check_gloo(context: Context) -> list[Check]:
    """On the placed nodes of a joined Ray cluster whose actor ranks span nodes; else here."""
    actor = context.view.actor_ranks()
    if ray_connected() and actor and len({a.node for a in actor}) > 1:
        return check_gloo_on_nodes(context, actor)
    return check_gloo_here(context)


def check_gloo_on_nodes(context: Context, actor: list) -> list[Check]:
    """All nodes' ranks at once (rank 0 hosts the rendezvous the others join)."""
    start = time.monotonic()
    nodes = live_nodes()
    host = nodes[actor[0].node]["NodeManagerAddress"]
    (port,) = on_every_node(nodes, port_on_node, (host,), START_UP_S, only={actor[0].node})
    if port.error:
        return [port.did_not_run(NAME)]
    timeout = context.options.handshake_timeout
    payloads = rank_payloads(len(actor), "gloo", host, port.result, timeout)
    by_node: dict[int, list[int]] = {}
    for assignment in actor:
        by_node.setdefault(assignment.node, []).append(assignment.rank)
    outcomes: dict[int, Outcome] = {}
    node_payloads = {node: [payloads[rank] for rank in ranks] for node, ranks in by_node.items()}
    for ran in on_every_node(
        nodes, ranks_on_node, (context.config, node_payloads, timeout), START_UP_S + timeout, only=set(by_node)
    ):
        if ran.error:
            return [ran.did_not_run(NAME)]
        outcomes.update(zip(by_node[ran.index], ran.result))
    seconds = time.monotonic() - start
    result = summarize([outcomes[r] for r in range(len(actor))], "gloo", len(actor), f"{host}:{port.result}", seconds)
    detail = f"gloo, placed ({', '.join(f'rank {a.rank} on node {a.node}' for a in actor)}): {result.detail}"
    if result.ok:
        return [replace(passed(NAME, detail), seconds=seconds)]
    remedy = (
        "each rank connects to every other at the address it advertises (named above): set "
        "GLOO_SOCKET_IFNAME in cluster.env_vars for each node to its interface on the network between the nodes"
    )
    return [replace(failed(NAME, detail, remedy), seconds=seconds)]
