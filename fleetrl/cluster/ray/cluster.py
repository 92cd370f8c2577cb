"""Ray for a run: connect to (or start) a Ray cluster and run each worker as a pinned Ray actor.

`cluster.simulate_nodes: N` starts N raylets on this machine (`ray.cluster_utils.Cluster`), all on
`cluster.node_ip` (127.0.0.1 by default), so a multi-node placement can be rehearsed on a laptop;
with `cluster.simulate_isolation: namespaces` each in namespaces of its own (`cluster/isolation/nodes.py`).
Every worker process gets `FLEETRL_COMPONENT`, `FLEETRL_RANK`, `FLEETRL_WORLD_SIZE`,
`FLEETRL_NODE_RANK`, its `CUDA_VISIBLE_DEVICES`, its thread count and `cluster.env_vars`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence

from fleetrl import exit_codes
from fleetrl.cluster.groups import RayGroup, SentCalls
from fleetrl.cluster.isolation.nodes import IsolatedNodes
from fleetrl.cluster.ray.early_start import take_early
from fleetrl.cluster.ray.nodes import in_node_order, joins_loopback, set_ray_loopback
from fleetrl.cluster.ray.worker_host import WorkerHost, pack_step_results
from fleetrl.cluster.ray.worker_path import worker_python_path
from fleetrl.config.schema import ClusterConfig
from fleetrl.errors import ConfigError
from fleetrl.net import is_loopback
from fleetrl.plan.placement import Assignment
from fleetrl.probe.flight_recorder import RAYLET_VARIABLE
from fleetrl.probe.recorded_calls import WatchSpec
from fleetrl.teardown import kill_own_children
from fleetrl.watch.judging.last_words import LastWords, node_name, on_this_node
from fleetrl.watch.watcher import expire_after

LAST_WORDS_TIMEOUT_S = 20.0  # a task on the dead worker's node: a worker process to start there
log = logging.getLogger("fleetrl")
Deadline = Callable[[float, str], contextlib.AbstractContextManager]  # WatchSession.deadline


class RayCluster:
    """The driver's connection to Ray and the worker processes it created there; what the
    incident response needs to end them (`watch.judging.classify.RemoteWorkers`)."""

    def __init__(self, config: ClusterConfig, devices_per_node: int, deadline: Deadline, connect_timeout_s: float = 60):
        isolated = config.simulate_nodes > 1 and config.simulate_isolation == "namespaces"
        on_loopback = is_loopback(config.node_ip) if config.ray_address is None else joins_loopback(config.ray_address)
        set_ray_loopback(on_loopback and not isolated)  # isolated nodes: real addresses on a bridge
        import ray

        self.started = None  # the Ray nodes this process started (LocalRay, IsolatedNodes); None when joining
        self.owned: bool = config.ray_address is None
        self.workers: list[tuple[Assignment, object]] = []  # every worker created: (assignment, handle)
        self.sent: SentCalls = SentCalls()  # the calls its groups sent, one record: a wait may mix groups
        # Workers import `module:attr` entry points the way the driver does: from its cwd first.
        self.python_path: str = os.pathsep.join([os.getcwd(), *sys.path[1:]])
        self.env_vars: dict = config.env_vars
        # Run first by `shutdown`, e.g. a compiled graph's teardown: before Ray ends its actors.
        self.before_shutdown: list[Callable[[], None]] = []
        with deadline(connect_timeout_s, f"connecting to Ray ({config.ray_address or 'a new local cluster'})"):
            if config.ray_address is not None:
                ray.init(address=config.ray_address)
                log.info("joined the running Ray instance at %s", config.ray_address)
            elif isolated:
                self.started = IsolatedNodes(config.simulate_nodes, devices_per_node, skews(config))
                ray.init(address=self.started.address, _node_ip_address=self.started.host_address)
            else:  # a new instance (N simulated nodes, or one), never some other session's running cluster
                self.started = start_local_ray(max(config.simulate_nodes, 1), devices_per_node, config.node_ip)
                ray.init(address=self.started.address, _node_ip_address=config.node_ip)
        pack_step_results()
        self.node_ids = ordered_node_ids(self.started)
        self.raylets = raylet_addresses(self.node_ids)
        if len(self.node_ids) < config.num_nodes:
            self.shutdown()
            raise ConfigError(
                "cluster.num_nodes",
                config.num_nodes,
                f"at most the {len(self.node_ids)} alive node(s) of the Ray cluster",
            )

    def create_group(
        self,
        assignments: Sequence[Assignment],
        worker_class: type,
        args_for_rank: Callable[[int], tuple],
        watch: WatchSpec,
        interrupt: threading.Event,
        **options,
    ) -> RayGroup:
        """`start_processes(...)` (`options`: its own), each process then building its worker from
        `args_for_rank(rank)` (`build_workers`); a group of `worker_class` workers."""
        group = self.start_processes(assignments, worker_class, watch, interrupt, **options)
        build_workers(group, args_for_rank)
        return group

    def start_processes(
        self,
        assignments: Sequence[Assignment],
        worker_class: type,
        watch: WatchSpec,
        interrupt: threading.Event,
        factory: Callable | None = None,
        host_class: type = WorkerHost,
        prefix: str = "",
    ) -> RayGroup:
        """One `host_class` Ray actor per assignment, set up and watched, with the worker class's
        imports done, but no worker yet: `build_workers` builds each, `factory(*args)` (by
        default `worker_class(*args)`), once the arguments are known (cluster/ray/worker_host.py)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        host = ray.remote(host_class)
        handles = []
        for assignment in assignments:
            strategy = NodeAffinitySchedulingStrategy(self.node_ids[assignment.node], soft=False)
            env_vars = self.worker_env_vars(assignment)
            handles.append(
                host.options(
                    num_cpus=0,
                    scheduling_strategy=strategy,
                    runtime_env={"env_vars": env_vars},
                    name=f"fleetrl-{assignment.component}-{assignment.rank}-{os.getpid()}",
                ).remote(assignment.cpu_threads, factory or worker_class, assignment, watch)
            )
        self.workers.extend(zip(assignments, handles))
        return RayGroup(assignments, handles, worker_class, interrupt, self.sent, prefix)

    def worker_env_vars(self, assignment: Assignment) -> dict:
        shared = {k: str(v) for k, v in self.env_vars.items() if not isinstance(v, dict)}
        per_node = self.env_vars.get(assignment.node, self.env_vars.get(str(assignment.node), {}))
        return {
            **shared,
            **{k: str(v) for k, v in per_node.items()},
            "PYTHONPATH": worker_python_path(self.python_path),
            "FLEETRL_COMPONENT": assignment.component,
            "FLEETRL_RANK": str(assignment.rank),
            "FLEETRL_WORLD_SIZE": str(assignment.world_size),
            "FLEETRL_NODE_RANK": str(assignment.node),
            RAYLET_VARIABLE: self.raylets[assignment.node],
            "CUDA_VISIBLE_DEVICES": assignment.visible_devices,
            "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",  # fleetrl's placement decides
            "OMP_NUM_THREADS": str(assignment.cpu_threads),
        }

    def node_ip(self, node: int) -> str:
        import ray

        for entry in ray.nodes():
            if entry["NodeID"] == self.node_ids[node]:
                return entry["NodeManagerAddress"]
        raise RuntimeError(f"node {node} is not in the Ray cluster any more")

    def controller_ip(self) -> str:
        """The address workers reach this process at (for the heartbeat store)."""
        import ray

        return ray.util.get_node_ip_address()

    def actor_ids(self) -> dict:
        """Ray actor id (hex) → (component, rank), to name the worker in a RayActorError."""
        return {handle._actor_id.hex(): (a.component, a.rank) for a, handle in self.workers}

    def last_words(self, key: tuple[str, int], pid: int | None) -> LastWords | None:
        """The last words of worker `key` (process `pid`, dead), read on its node by a Ray task
        pinned there (watch/judging/last_words.py); None for a worker this cluster did not start."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = next((a.node for a, _ in self.workers if (a.component, a.rank) == key), None)
        if node is None or pid is None:
            return None
        reader = ray.remote(on_this_node).options(
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.node_ids[node], soft=False),
            runtime_env={"env_vars": {"PYTHONPATH": worker_python_path(self.python_path)}},
        )
        try:
            return LastWords(**ray.get(reader.remote(pid, node), timeout=LAST_WORDS_TIMEOUT_S))
        except Exception as error:  # its node is gone too, or Ray cannot start a task there
            return LastWords("ended (Ray gave no account of it)", node_name(node, None), f"(not read: {error})")

    def kill_remote_workers(self) -> None:
        """After an incident on a cluster fleetrl did not start: ask Ray to end our actors.
        (A cluster fleetrl started dies with this process's children; isolated simulated nodes
        are removed here, as namespaces and links outlive the processes in them.)"""
        import ray

        if isinstance(self.started, IsolatedNodes):
            self.started.shutdown()
        if self.owned:
            return
        for _, handle in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

    def stop_after_incident(self) -> None:
        """End the workers through Ray and disconnect this driver before its daemons are killed:
        a driver left connected to a killed GCS waits a minute at exit, then aborts. The report
        is written by now; should stopping hang, this process ends with the incident's code."""

        def expire() -> None:
            log.error("stopping Ray after the incident did not finish within 30 s; stopping now")
            kill_own_children()
            os._exit(exit_codes.INCIDENT)

        if not isinstance(self.started, IsolatedNodes):  # isolated nodes go in shutdown(), after the driver
            self.kill_remote_workers()
        with expire_after(30, expire):
            self.shutdown()

    def shutdown(self) -> None:
        import ray

        while self.before_shutdown:
            self.before_shutdown.pop()()
        ray.shutdown()
        if self.started is not None:
            self.started.shutdown()
            self.started = None


def build_workers(group: RayGroup, args_for_rank: Callable[[int], tuple]) -> None:
    """Build each rank's worker in the process `start_processes` started; not waited for: a
    failure is raised by the rank's next call (`WorkerHost.start`)."""
    for assignment, handle in zip(group.assignments, group.handles):
        handle.start.remote(args_for_rank(assignment.rank))


def start_local_ray(num_nodes: int, cpus_per_node: int, node_ip: str):
    """A new local instance: the one the controller started at its start (cluster/ray/early_start.py),
    if it has this shape, else one started now."""
    early = take_early(num_nodes, cpus_per_node, node_ip)
    if early is not None:
        return early
    from fleetrl.cluster.ray.local import LocalRay  # imports Ray: after set_ray_loopback

    if num_nodes > 1:
        log.info("starting a simulated %d-node Ray cluster on %s", num_nodes, node_ip)
    return LocalRay(num_nodes, cpus_per_node, node_ip)


def skews(config: ClusterConfig) -> dict[int, float]:
    return {int(node): float(seconds) for node, seconds in config.simulate_clock_skew_s.items()}


def raylet_addresses(node_ids: list[str]) -> list[str]:
    """host:port of each node's raylet, by node index: what tells a lost node (watch/judging/node_loss.py)."""
    import ray

    by_id = {n["NodeID"]: f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}" for n in ray.nodes()}
    return [by_id[node_id] for node_id in node_ids]


def ordered_node_ids(started) -> list[str]:
    """Node index → Ray node id: the nodes this process started, in the order it added them; on a real
    cluster the head first, then the others by address (`nodes.py`)."""
    if isinstance(started, IsolatedNodes):
        return started.node_ids()
    if started is not None:
        return [node.node_id for node in started.list_all_nodes()]
    import ray

    return [n["NodeID"] for n in in_node_order(ray.nodes())]
