"""The running job's three worker groups — env, rollout, actor — on the chosen backend.

`resolve_layout` turns the `cluster` section into a checked `Placement` and a backend name before
anything starts; `Runtime.start` builds the groups (inline objects or pinned Ray actors), joins
the actor ranks into one process group, and gives the rollout workers their lanes.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fleetrl.algos.registry import algorithm_spec
from fleetrl.cluster.fused import ComponentView, FusedCollector, FusedRank, check_fusable, fused_assignments
from fleetrl.cluster.groups import InlineGroup
from fleetrl.cluster.placement import Assignment, Placement, check_divisible, resolve_placement
from fleetrl.collect import Collector, plan_lanes
from fleetrl.config.schema import Config
from fleetrl.config.validate import check_actor_layout, check_fault_placement, check_spaces
from fleetrl.errors import ConfigError, UserError
from fleetrl.watch import flight_recorder
from fleetrl.watch.classify import incident_from_error
from fleetrl.watch.faults import FaultPlan
from fleetrl.watch.flight_recorder import Recorder
from fleetrl.watch.host import CallRunner, WatchSpec
from fleetrl.watch.respond import IncidentStop, respond
from fleetrl.watch.stacks import register_stack_dump, stack_file
from fleetrl.watch.store import HeartbeatStore
from fleetrl.watch.teardown import kill_own_children
from fleetrl.watch.watchdog import Watchdog
from fleetrl.workers.env_worker import EnvWorker

log = logging.getLogger("fleetrl")


def detect_devices_per_node() -> int:
    import torch

    return torch.cuda.device_count() or os.cpu_count() or 1


@dataclass(frozen=True)
class Layout:
    placement: Placement
    backend: str  # inline | ray
    fused: bool = False  # ray: each rank's env, rollout and actor in one process (cluster/fused.py)


def resolve_layout(config: Config) -> Layout:
    cluster = config.cluster
    devices = cluster.devices_per_node or detect_devices_per_node()
    placement = resolve_placement(
        cluster.num_nodes, devices, cluster.component_placement, cpu_count_per_node=os.cpu_count()
    )
    check_data_layout(config, placement)
    check_actor_layout(config, placement.world_size("actor"))
    check_fault_placement(config, placement)
    single = cluster.num_nodes == 1 and all(placement.world_size(c) == 1 for c in ("actor", "rollout", "env"))
    backend = cluster.backend
    if backend == "auto":
        backend = "inline" if single and cluster.simulate_nodes <= 1 else "ray"
    if backend == "inline" and not single:
        raise ConfigError(
            "cluster.backend",
            "inline",
            "'ray' or 'auto': inline runs one rank per component on one node, and this placement has more",
        )
    fused = cluster.fuse_collocated and backend == "ray"
    if fused:
        check_fusable(config, placement)
    return Layout(placement, backend, fused)


def worker_processes(layout: Layout) -> list[Assignment]:
    """The processes the Ray backend starts: one per fused rank, or one per rank of each component."""
    if layout.fused:
        return fused_assignments(layout.placement, os.cpu_count())
    return list(layout.placement.assignments)


def check_data_layout(config: Config, placement: Placement) -> None:
    """Envs split evenly over env ranks and stages; trajectories evenly over actor ranks."""
    env_world, stages = placement.world_size("env"), config.rollout.pipeline_stage_num
    check_divisible(placement, "env", "env.num_envs", config.env.num_envs)
    if (config.env.num_envs // env_world) % stages:
        raise ConfigError(
            "rollout.pipeline_stage_num",
            stages,
            f"a divisor of the envs per env worker ({config.env.num_envs // env_world})",
        )
    check_divisible(placement, "actor", "env.num_envs", config.env.num_envs)
    rollout_world = placement.world_size("rollout")
    if env_world % rollout_world:
        raise ConfigError(
            "cluster.component_placement.rollout",
            rollout_world,
            f"a rollout world size dividing the env world size ({env_world})",
        )


class Runtime:
    """Starts the workers under a watchdog: every worker beats into a store this process owns,
    and from the moment the workers exist any stall, death or desync ends in a report."""

    def __init__(self, config: Config, layout: Layout, run_dir: Path):
        self.config, self.layout, self.run_dir = config, layout, Path(run_dir)
        self.ray = None
        self.watchdog: Watchdog | None = None
        self.recorder: Recorder | None = None  # the controller's own, on the inline backend
        self.watched: list[dict] = []
        self.fused = None  # the RayGroup of fused ranks, when the layout fuses them
        self.torn_down = False  # an incident already ended every worker
        try:
            if layout.backend == "inline":
                self._start_inline()
            else:
                self._start_ray()
            lane_sizes = self.lane_sizes()
            self.rollout.get(
                [
                    self.rollout.call(
                        rank,
                        "configure_lanes",
                        sizes,
                        config.algorithm.num_steps,
                        self.observation_space,
                        self.action_space,
                    )
                    for rank, sizes in enumerate(lane_sizes)
                ]
            )
        except (UserError, KeyboardInterrupt):
            self.shutdown()
            raise
        except IncidentStop:
            raise
        except Exception as error:
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        """A worker's error reached the controller: report it as an incident, tear down, raise
        IncidentStop.
        If the watchdog is already reporting (a wait was interrupted), let it finish."""
        if self.watchdog is None:
            kill_own_children()
            raise error
        if self.watchdog.fired.is_set():
            self.watchdog.join()
            time.sleep(3600)  # respond() ends the process
        self.watchdog.stop()
        records = self.store.read([(w["component"], w["rank"]) for w in self.watched])
        # A dead worker shows up at the others as errors ("connection reset by peer"): name the
        # dead one as the cause, with the survivor's error as detail.
        incident = self.watchdog.check_alive(records, time.time())
        if incident is None:
            incident = incident_from_error(error, records, self.actor_ids())
        else:
            incident.detail = f"seen by the others as: {error}"
        incident.records = records
        respond(incident, self.run_dir, self.watched, self.stop_ray_after_incident)

    def stop_ray_after_incident(self) -> None:
        """End the workers through Ray and disconnect this driver before its daemons are killed:
        a driver left connected to a killed GCS waits a minute at exit, then aborts."""
        if self.ray is None:
            return
        from fleetrl.cluster.ray_cluster import deadline

        self.ray.kill_remote_workers()
        with deadline(30, "stopping Ray after the incident"):
            self.ray.shutdown()
        self.ray = None
        self.torn_down = True

    def actor_ids(self) -> dict:
        """Ray actor id (hex) → (component, rank), to name the worker in a RayActorError."""
        if self.ray is None:
            return {}
        return {
            handle._actor_id.hex(): (a.component, a.rank)
            for group in (self.env, self.rollout, self.actor)
            if hasattr(group, "handles")
            for a, handle in zip(group.assignments, group.handles)
        }

    @property
    def shares_process(self) -> bool:
        """Rollout uses the actor's own policy object: no weight sync needed."""
        return self.layout.backend == "inline" or self.layout.fused

    def collector(self) -> Collector | FusedCollector:
        """Drives env ⇄ rollout from here, or, for fused ranks, inside each rank's process."""
        if self.fused is not None:
            return FusedCollector(self.fused)
        return Collector(
            self.env, self.rollout, self.config.rollout.pipeline_stage_num, self.config.algorithm.num_steps
        )

    def env_worker_args(self, rank: int) -> tuple:
        config, world = self.config, self.layout.placement.world_size("env")
        per_rank = config.env.num_envs // world
        return (
            config.env,
            config.algorithm.gamma,
            config.runner.seed + rank * per_rank,
            per_rank,
            True,
            config.rollout.pipeline_stage_num,
            config.algorithm.reset_group_size,
        )

    def lane_sizes(self) -> list[list[int]]:
        placement, stages = self.layout.placement, self.config.rollout.pipeline_stage_num
        lane_size = self.config.env.num_envs // placement.world_size("env") // stages
        sizes: list[list[int]] = [[] for _ in range(placement.world_size("rollout"))]
        for lane in plan_lanes(placement.world_size("env"), placement.world_size("rollout"), stages):
            sizes[lane.rollout_rank].append(lane_size)
        return sizes

    def watch_spec(self, host: str) -> WatchSpec:
        self.store = HeartbeatStore(host)
        return WatchSpec(
            host,
            self.store.port,
            self.config.watchdog.heartbeat_interval_s,
            str(self.run_dir / "stacks"),
            self.config.debug.fault,
        )

    def start_watchdog(self, workers: list[dict], kill_remote=lambda: None) -> None:
        """Watch `workers` ({component, rank, node}); on an incident, report and tear down."""
        self.watched = workers
        if not self.config.watchdog.enabled:
            return
        keys = [(w["component"], w["rank"]) for w in workers]
        self.watchdog = Watchdog(
            self.config.watchdog,
            self.store.read,
            keys,
            lambda incident: respond(incident, self.run_dir, workers, kill_remote, exit_process=True),
        )
        self.watchdog.start()

    def _start_inline(self) -> None:
        """One process: the controller's own recorder stands for all three components."""
        placement, config = self.layout.placement, self.config
        spec = self.watch_spec("127.0.0.1")
        self.recorder = recorder = Recorder("inline", 0, 0)
        flight_recorder.install(recorder)
        register_stack_dump(stack_file(Path(spec.stack_dir), "inline", 0))
        recorder.start_publishing(self.store.publisher("inline", 0), spec.interval_s)
        self.start_watchdog([{"component": "inline", "rank": 0, "node": 0}])

        def group(component: str, worker) -> InlineGroup:
            runner = CallRunner(worker, component, 0, recorder, FaultPlan(config.debug.fault, component, 0))
            return InlineGroup(placement.ranks(component), [worker], [runner])

        env = EnvWorker(*self.env_worker_args(0))
        self.observation_space, self.action_space = env.observation_space, env.action_space
        try:
            check_spaces(config, self.observation_space, self.action_space)
        except ConfigError:
            env.close()
            raise
        workers = algorithm_spec(config.algorithm.name)
        actor = workers.actor(config, env.observation_space, env.action_space)
        self.env, self.actor = group("env", env), group("actor", actor)
        self.rollout = group("rollout", workers.rollout(actor.policy))

    def _start_ray(self) -> None:
        from fleetrl.cluster.ray_cluster import RayCluster

        config, placement = self.config, self.layout.placement
        self.ray = RayCluster(config.cluster, placement.devices_per_node)
        spec = self.watch_spec(self.ray.controller_ip())
        log.info(
            "starting %s%s",
            ", ".join(f"{placement.world_size(c)} {c}" for c in ("env", "rollout", "actor")),
            " (fused: one process per rank)" if self.layout.fused else "",
        )
        groups = self._start_fused(spec) if self.layout.fused else self._start_components(spec)
        self.start_watchdog(
            [{"component": a.component, "rank": a.rank, "node": a.node} for group in groups for a in group.assignments],
            self.ray.kill_remote_workers,
        )
        if self.watchdog is not None:
            for group in groups:
                group.interrupt = self.watchdog.fired
        if self.fused is not None:  # the learners, now under the watchdog
            self.fused.get(self.fused.call_all("fused.build_learner", *self.spaces()))
        world = placement.world_size("actor")
        if world > 1:
            address = self.ray.node_ip(placement.ranks("actor")[0].node)
            port = self.actor.get(self.actor.handles[0].free_port.remote(address))
            log.info("actor process group: %d ranks, rendezvous at %s:%d", world, address, port)
            self.actor.get(self.actor.call_all("init_distributed", address, port))

    def _start_components(self, spec: WatchSpec) -> list:
        """One Ray actor per rank of each component; returns the groups to watch."""
        config, placement = self.config, self.layout.placement
        world = placement.world_size("actor")
        workers = algorithm_spec(config.algorithm.name)
        self.env = self.ray.create_group(placement.ranks("env"), EnvWorker, self.env_worker_args, spec)
        check_spaces(config, *self.spaces())  # e.g. sac on discrete actions: a config error, nothing else started
        self.actor = self.ray.create_group(
            placement.ranks("actor"), workers.actor, lambda rank: (config, *self.spaces(), rank, world), spec
        )
        self.rollout = self.ray.create_group(
            placement.ranks("rollout"), workers.rollout.from_config, lambda rank: (config, *self.spaces()), spec
        )
        return [self.env, self.rollout, self.actor]

    def _start_fused(self, spec: WatchSpec) -> list:
        """One Ray actor per rank that will hold its env, rollout and actor: the env first, so
        that the spaces are checked before any learner is built."""
        from fleetrl.cluster.ray_cluster import FusedHost

        config, world = self.config, self.layout.placement.world_size("actor")
        self.fused = self.ray.create_group(
            worker_processes(self.layout),
            FusedRank,
            lambda rank: (config, self.env_worker_args(rank), rank, world),
            spec,
            host_class=FusedHost,
        )
        self.env, self.rollout, self.actor = (ComponentView(self.fused, c) for c in ("env", "rollout", "actor"))
        check_spaces(config, *self.spaces())
        return [self.fused]

    def spaces(self) -> tuple:
        """Observation and action spaces, asked of env rank 0 once."""
        if not hasattr(self, "observation_space"):
            self.observation_space, self.action_space = self.env.get(self.env.call(0, "spaces"))
        return self.observation_space, self.action_space

    def shutdown(self) -> None:
        """Stop the threads that use the heartbeat store, close the simulators (they may own
        subprocesses), then stop Ray if started."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.recorder is not None:
            self.recorder.stop()
        if self.torn_down:
            return
        if hasattr(self, "env"):
            self.env.get(self.env.call_all("close"))
        if self.ray is not None:
            self.ray.shutdown()
            self.ray = None
