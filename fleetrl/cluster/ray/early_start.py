"""The run's own Ray instance, started on a thread of its own at the controller's very start.

Starting Ray's daemons (GCS, raylet, their agents: other processes) takes seconds, and so do the
controller's own imports (torch, the algorithm, the models) and the config checks before the
backend asks for Ray (benchmarks/scaling/ray_startup.py). Started here, the two overlap: by the time
`RayCluster` wants a new local instance, `take` hands it over, started or still starting (joined
under RayCluster's start-up deadline, so a start that hangs is still reported as
`startup_timeout`; one that failed raises its error there, as starting it there would have).

Only a run that will certainly start a plain local instance starts one early: `cluster.backend:
ray` (or several simulated nodes), no `cluster.ray_address`, no isolated nodes, and a known
`cluster.devices_per_node` (detecting it imports torch, the very import to overlap). An instance
no backend takes (a config error stops the run first) is shut down by `close`.
"""

from __future__ import annotations

import threading

from fleetrl.cluster.ray.nodes import set_ray_loopback
from fleetrl.config.schema import ClusterConfig
from fleetrl.net import is_loopback


class EarlyRay:
    """`LocalRay(nodes, devices_per_node, node_ip)` being started on a thread."""

    def __init__(self, nodes: int, devices_per_node: int, node_ip: str):
        self.shape: tuple[int, int, str] = (nodes, devices_per_node, node_ip)
        self.started = None  # the LocalRay, once up
        self.error: BaseException | None = None
        self.up = threading.Event()  # started, or failed to
        # The thread outlives the start: Ray's daemons are started with a parent-death signal,
        # which Linux sends when the *thread* that started them ends; parked, it ends with the process.
        self.thread = threading.Thread(target=self.start, name="fleetrl-early-ray", daemon=True)
        self.thread.start()

    def start(self) -> None:
        try:
            set_ray_loopback(is_loopback(self.shape[2]))  # as RayCluster sets it: before Ray's import
            from fleetrl.cluster.ray.local import LocalRay

            self.started = LocalRay(*self.shape)
        except BaseException as error:  # raised where the backend takes the instance
            self.error = error
            self.up.set()
            return
        self.up.set()
        threading.Event().wait()  # parked for good: see `__init__`

    def take(self, nodes: int, devices_per_node: int, node_ip: str):
        """The instance, once started, if it has this shape (None otherwise: it is shut down)."""
        self.up.wait()
        if self.error is not None:
            raise self.error
        if (nodes, devices_per_node, node_ip) != self.shape:
            self.close()
            return None
        started, self.started = self.started, None
        return started

    def close(self) -> None:
        self.up.wait()
        if self.started is not None:
            self.started.shutdown()
            self.started = None


PENDING: list[EarlyRay] = []  # at most one: the controller's


def start_early(cluster: ClusterConfig) -> None:
    """Start the run's local Ray instance now, where the config says one will be started."""
    ray_run = cluster.backend == "ray" or cluster.simulate_nodes > 1
    isolated = cluster.simulate_nodes > 1 and cluster.simulate_isolation == "namespaces"
    if ray_run and cluster.ray_address is None and not isolated and cluster.devices_per_node is not None:
        PENDING.append(EarlyRay(max(cluster.simulate_nodes, 1), cluster.devices_per_node, cluster.node_ip))


def take_early(nodes: int, devices_per_node: int, node_ip: str):
    """The instance started early with this shape, or None."""
    return PENDING.pop().take(nodes, devices_per_node, node_ip) if PENDING else None


def close_early() -> None:
    """Shut down an instance started early that no backend took."""
    while PENDING:
        PENDING.pop().close()
