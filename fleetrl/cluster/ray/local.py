"""A Ray instance on this machine with only what a run needs: N raylets (N = 1 for a plain local
run, `cluster.simulate_nodes` to rehearse a cluster), started by this process.

`ray.init(address="local")` and `ray.cluster_utils.Cluster` also start, on the head, Ray's API
server (the dashboard process, which with `include_dashboard=False` still loads its usage-stats
module) and the autoscaler's monitor, and `ray.init` waits until the API server has come up.
fleetrl uses neither (no dashboard, no job submission, no state API, no autoscaling: its workers
are pinned to fixed nodes), and on a busy 2-core machine the two Python processes cost seconds of
start-up, the wait alone ~2.6 s (benchmarks/scaling/ray_startup.py); nor the idle workers Ray prestarts
(`NO_PRESTARTED_WORKERS`). Everything else is Ray's own start-up (GCS, raylets with their agents,
the log monitor that forwards worker output to the driver).

The nodes are children of this process: `shutdown` ends them, and an incident's teardown
(`kill_own_children`) or the run's janitor ends them too.
"""

from __future__ import annotations

import atexit
import os

from ray._private.authentication.authentication_token_setup import (
    enable_token_auth_by_default,
    ensure_token_if_auth_enabled,
)
from ray._private.node import Node
from ray._private.parameter import RayParams
from ray._private.services import wait_for_node
from ray._private.utils import write_ray_address

from fleetrl.probe.child_activity import starting_ray

NODE_JOIN_TIMEOUT_S = 60
# Ray starts one idle Python worker per CPU slot when the first driver connects, for tasks;
# fleetrl's workers are actors with a runtime_env of their own and never reuse them, so they are
# only processes importing Ray on the cores the run's own workers start on.
NO_PRESTARTED_WORKERS = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}
SIMULATED_OBJECT_STORE_BYTES = 150 * 1024 * 1024  # per simulated node, as `ray.cluster_utils.Cluster`


class NodeWithoutSignalHandler(Node):
    """A node that leaves signals to fleetrl. Ray's sets a SIGTERM handler that ends the node's
    processes and exits 1, replacing the controller's own (fleetrl/signals.py: a SIGTERM asks for a
    checkpoint first), and a handler can only be set on the main thread (cluster/ray/early_start.py
    starts the nodes on another). Ray's cleanup at interpreter exit stays."""

    def _register_shutdown_hooks(self) -> None:
        atexit.register(self.kill_all_processes, check_alive=False, allow_graceful=True)


class HeadWithoutApiServer(NodeWithoutSignalHandler):
    """A head node that starts no API server (see the module docstring)."""

    def start_api_server(self, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
        return None


class LocalRay:
    """`num_nodes` raylets on `node_ip`, `cpus_per_node` CPU slots each; the first is the head."""

    def __init__(self, num_nodes: int, cpus_per_node: int, node_ip: str):
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing reported from a run's cluster
        enable_token_auth_by_default()  # as `ray.init` does for a new cluster (unless RAY_AUTH_MODE says)
        ensure_token_if_auth_enabled({}, create_token_if_missing=True)
        common = {"num_cpus": cpus_per_node, "node_ip_address": node_ip, "include_dashboard": False}
        if num_nodes > 1:  # several object stores in one machine's memory
            common["object_store_memory"] = SIMULATED_OBJECT_STORE_BYTES
        head = RayParams(**common, no_monitor=True, _system_config=NO_PRESTARTED_WORKERS)
        # Ray's daemons are this process's children but no simulator's: never evidence that a
        # waiting call works, never ended as a simulator's leftovers (probe/child_activity.py)
        with starting_ray():
            self.nodes: list[Node] = [HeadWithoutApiServer(head, head=True, shutdown_at_exit=True, spawn_reaper=True)]
            self.address: str = self.nodes[0].address
            for _ in range(num_nodes - 1):
                params = RayParams(**common, gcs_address=self.address, include_log_monitor=False, node_manager_port=0)
                node = NodeWithoutSignalHandler(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
                wait_for_node(self.address, node.plasma_store_socket_name, NODE_JOIN_TIMEOUT_S)  # in order
                self.nodes.append(node)
        if num_nodes > 1:  # as `ray.cluster_utils.Cluster` did (the janitor forgets it after a kill -9)
            write_ray_address(self.address)

    def list_all_nodes(self) -> list[Node]:
        """Every node, in the order they were started (node index order)."""
        return list(self.nodes)

    def shutdown(self) -> None:
        """End every node's processes, the head last; call after the driver has disconnected."""
        for node in reversed(self.nodes):
            node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
        self.nodes = []
