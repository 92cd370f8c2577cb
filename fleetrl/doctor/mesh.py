"""All-pairs TCP reachability between the nodes of a live Ray cluster.

Gloo's connectFullMesh needs every node to reach every other one; a one-way firewall rule breaks
it for one pair only, which no check run from a single machine can see. Here one small task
pinned to each node connects to every node's raylet port (a port known to be listening), and each
failing pair is reported by name and address.
"""

from __future__ import annotations

from fleetrl.doctor.context import Context
from fleetrl.doctor.on_nodes import START_UP_S, live_nodes, on_every_node
from fleetrl.doctor.reachability import probe
from fleetrl.doctor.resources import ray_connected
from fleetrl.doctor.result import Check, failed, passed, skipped

NAME = "network.mesh"


def probe_all(_node: int, targets: list[tuple[int, str, int]], timeout: float) -> list[dict]:
    """Runs on one node: one TCP connect to each (node, host, port)."""
    results = []
    for node, host, port in targets:
        outcome = probe(host, port, timeout)
        results.append(
            {
                "node": node,
                "target": outcome.target,
                "ok": outcome.ok,
                "ms": outcome.seconds * 1000,
                "error": outcome.error,
            }
        )
    return results


def check_mesh(context: Context) -> list[Check]:
    if not ray_connected():
        if context.view.remote_peers:
            return [
                skipped(
                    NAME,
                    "no Ray cluster to reach the other nodes through: set "
                    "cluster.ray_address (the doctor joins it) to try every pair",
                )
            ]
        return [skipped(NAME, "one machine: no pair of nodes to try")]
    nodes = live_nodes()
    targets = [(index, node["NodeManagerAddress"], int(node["NodeManagerPort"])) for index, node in enumerate(nodes)]
    timeout = context.options.connect_timeout
    checks, worst = [], 0.0
    for outcome in on_every_node(nodes, probe_all, (targets, timeout), START_UP_S + timeout * len(targets)):
        source = outcome.source
        if outcome.error:
            checks.append(outcome.did_not_run(NAME))
            continue
        for result in outcome.result:
            worst = max(worst, result["ms"])
            if not result["ok"]:
                checks.append(
                    failed(
                        NAME,
                        f"{source} → node {result['node']} at {result['target']}: unreachable, {result['error']}",
                        f"open the network from {source} to node {result['node']} (firewall, "
                        f"security group, routes); Gloo needs every pair of nodes to connect",
                    )
                )
    if not checks:
        checks.append(passed(NAME, f"all {len(nodes)}x{len(nodes)} pairs of nodes connect (slowest {worst:.1f} ms)"))
    return checks
