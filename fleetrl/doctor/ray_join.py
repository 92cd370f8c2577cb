"""Join the Ray cluster the config names, so the other checks see every live node.

The preflight joins too, first, so that the checks that run on every node (a node's full Ray
temp directory) stop `fleetrl train` before it starts; it leaves again, and the run joins its own
way. Without cluster.ray_address nothing is joined (fleetrl starts its own Ray). The head's port is tried with a plain TCP connect first, so an unreachable head fails in
seconds instead of inside `ray.init`. A cluster the doctor joined, it leaves when it is done.
"""

from __future__ import annotations

import logging

from fleetrl.doctor.context import Context
from fleetrl.doctor.reachability import probe
from fleetrl.doctor.resources import live_cluster, ray_connected
from fleetrl.doctor.result import Check, failed, passed, skipped

NAME = "ray.cluster"


def describe_nodes() -> str:
    cluster = live_cluster(count_gpus=False)
    nodes = ", ".join(
        f"node {index} {node.address} ({node.cpus} CPU, {node.gpus} GPU)" for index, node in enumerate(cluster.nodes)
    )
    return f"{len(cluster.nodes)} live node(s): {nodes}"


def check_ray(context: Context) -> list[Check]:
    view = context.view
    if ray_connected():
        return [passed(NAME, f"connected: {describe_nodes()}")]
    if view.ray_address is None:
        return [skipped(NAME, "no cluster.ray_address: fleetrl starts its own Ray when it needs one")]
    head = view.ray_head()
    if head is not None:
        reached = probe(head.host, head.port, context.options.connect_timeout)
        if not reached.ok:
            return [
                failed(
                    NAME,
                    f"cannot join the Ray cluster at {view.ray_address}: "
                    f"{reached.target} is unreachable, {reached.error}",
                    f"start it (`ray start --head --port={head.port}` on the head node) "
                    f"or fix cluster.ray_address / RAY_ADDRESS",
                )
            ]
    from fleetrl.cluster.ray.nodes import joins_loopback, set_ray_loopback

    set_ray_loopback(joins_loopback(view.ray_address))  # before Ray is imported: else it rewrites 127.0.0.1
    import ray

    try:
        ray.init(address=view.ray_address, log_to_driver=False, logging_level=logging.WARNING, configure_logging=False)
    except Exception as error:  # noqa: BLE001 — any failure to join is the finding
        first_line = (str(error).strip().splitlines() or [""])[0]
        return [
            failed(
                NAME,
                f"cannot join the Ray cluster at {view.ray_address}: {type(error).__name__}: {first_line}",
                "check that every node runs the same Ray and Python versions and that "
                "the head is healthy (`ray status` on it)",
            )
        ]
    context.cleanups.append(ray.shutdown)
    return [passed(NAME, f"joined {view.ray_address}: {describe_nodes()}")]
