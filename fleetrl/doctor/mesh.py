"""All-pairs TCP reachability between the nodes of a live Ray cluster.

Gloo's connectFullMesh needs every node to reach every other one; a one-way firewall rule breaks
it for one pair only, which no check run from a single machine can see. Here one small task
pinned to each node connects to every node's raylet port (a port known to be listening), and each
failing pair is reported by name and address.
"""

from __future__ import annotations

from fleetrl.doctor.context import Context
from fleetrl.doctor.live import ray_connected
from fleetrl.doctor.reachability import probe
from fleetrl.doctor.result import Check, failed, passed, skipped

NAME = "network.mesh"
START_UP_S = 20.0  # a task's worker process may need to start (import torch and all) first


def probe_all(targets: list[tuple[int, str, int]], timeout: float) -> list[dict]:
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


def live_nodes() -> list[dict]:
    """Ray's alive nodes in fleetrl's node order: the head first, then by address."""
    import ray

    alive = [node for node in ray.nodes() if node.get("Alive")]
    alive.sort(key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"], n["NodeID"]))
    return alive


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
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = live_nodes()
    targets = [(index, node["NodeManagerAddress"], int(node["NodeManagerPort"])) for index, node in enumerate(nodes)]
    timeout = context.options.connect_timeout
    task = ray.remote(num_cpus=0, max_retries=0)(probe_all)
    refs = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
            targets, timeout
        )
        for node in nodes
    ]
    deadline = START_UP_S + timeout * len(targets)
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=deadline)
    checks, worst = [], 0.0
    for index, ref in enumerate(refs):
        source = f"node {index} ({targets[index][1]})"
        if ref not in ready:
            ray.cancel(ref, force=True)
            checks.append(
                failed(
                    NAME,
                    f"{source} did not run its probe within {deadline:g} s",
                    f"check that {source} is healthy (`ray status`) and can start workers",
                )
            )
            continue
        try:
            results = ray.get(ref)
        except Exception as error:  # noqa: BLE001 — a probe that cannot run is the finding
            checks.append(
                failed(
                    NAME,
                    f"{source}: the probe failed: {type(error).__name__}: {error}",
                    f"check the Ray workers on {source}",
                )
            )
            continue
        for result in results:
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
