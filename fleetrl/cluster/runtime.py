"""The running job's three worker groups — env, rollout, actor — on the chosen backend.

`resolve_layout` turns the `cluster` section into a checked `Placement` and a backend name before
anything starts; `Runtime.start` builds the groups (inline objects or pinned Ray actors), joins
the actor ranks into one process group, and gives the rollout workers their lanes.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from fleetrl.algos.registry import algorithm_workers
from fleetrl.cluster.groups import InlineGroup
from fleetrl.cluster.placement import Placement, check_divisible, resolve_placement
from fleetrl.collect import plan_lanes
from fleetrl.config.schema import Config
from fleetrl.config.validate import check_actor_layout
from fleetrl.errors import ConfigError
from fleetrl.workers.env_worker import EnvWorker

log = logging.getLogger("fleetrl")


def detect_devices_per_node() -> int:
    import torch

    return torch.cuda.device_count() or os.cpu_count() or 1


@dataclass(frozen=True)
class Layout:
    placement: Placement
    backend: str  # inline | ray


def resolve_layout(config: Config) -> Layout:
    cluster = config.cluster
    if cluster.simulate_nodes > 1 and cluster.simulate_nodes != cluster.num_nodes:
        raise ConfigError("cluster.simulate_nodes", cluster.simulate_nodes,
                          f"0, or equal to cluster.num_nodes ({cluster.num_nodes})")
    devices = cluster.devices_per_node or detect_devices_per_node()
    placement = resolve_placement(cluster.num_nodes, devices, cluster.component_placement,
                                  cpu_count_per_node=os.cpu_count())
    check_data_layout(config, placement)
    check_actor_layout(config, placement.world_size("actor"))
    single = cluster.num_nodes == 1 and all(
        placement.world_size(c) == 1 for c in ("actor", "rollout", "env"))
    backend = cluster.backend
    if backend == "auto":
        backend = "inline" if single and cluster.simulate_nodes <= 1 else "ray"
    if backend == "inline" and not single:
        raise ConfigError("cluster.backend", "inline",
                          "'ray' or 'auto': inline runs one rank per component on one node, and "
                          "this placement has more")
    return Layout(placement, backend)


def check_data_layout(config: Config, placement: Placement) -> None:
    """Envs split evenly over env ranks and stages; trajectories evenly over actor ranks."""
    env_world, stages = placement.world_size("env"), config.rollout.pipeline_stage_num
    check_divisible(placement, "env", "env.num_envs", config.env.num_envs)
    if (config.env.num_envs // env_world) % stages:
        raise ConfigError("rollout.pipeline_stage_num", stages,
                          f"a divisor of the envs per env worker ({config.env.num_envs // env_world})")
    check_divisible(placement, "actor", "env.num_envs", config.env.num_envs)
    rollout_world = placement.world_size("rollout")
    if env_world % rollout_world:
        raise ConfigError("cluster.component_placement.rollout", rollout_world,
                          f"a rollout world size dividing the env world size ({env_world})")


class Runtime:
    def __init__(self, config: Config, layout: Layout):
        self.config, self.layout = config, layout
        self.ray = None
        if layout.backend == "inline":
            self._start_inline()
        else:
            self._start_ray()
        lane_sizes = self.lane_sizes()
        self.rollout.get([self.rollout.call(rank, "configure_lanes", sizes, config.algorithm.num_steps,
                                            self.observation_space, self.action_space)
                          for rank, sizes in enumerate(lane_sizes)])

    @property
    def shares_process(self) -> bool:
        """Rollout uses the actor's own policy object: no weight sync needed."""
        return self.layout.backend == "inline"

    def env_worker_args(self, rank: int) -> tuple:
        config, world = self.config, self.layout.placement.world_size("env")
        per_rank = config.env.num_envs // world
        return (config.env, config.algorithm.gamma, config.runner.seed + rank * per_rank, per_rank,
                True, config.rollout.pipeline_stage_num)

    def lane_sizes(self) -> list[list[int]]:
        placement, stages = self.layout.placement, self.config.rollout.pipeline_stage_num
        lane_size = self.config.env.num_envs // placement.world_size("env") // stages
        sizes: list[list[int]] = [[] for _ in range(placement.world_size("rollout"))]
        for lane in plan_lanes(placement.world_size("env"), placement.world_size("rollout"), stages):
            sizes[lane.rollout_rank].append(lane_size)
        return sizes

    def _start_inline(self) -> None:
        placement = self.layout.placement
        env = EnvWorker(*self.env_worker_args(0))
        self.observation_space, self.action_space = env.observation_space, env.action_space
        workers = algorithm_workers(self.config.algorithm.name)
        actor = workers.actor(self.config, env.observation_space, env.action_space)
        self.env = InlineGroup(placement.ranks("env"), [env])
        self.actor = InlineGroup(placement.ranks("actor"), [actor])
        self.rollout = InlineGroup(placement.ranks("rollout"), [workers.rollout(actor.policy)])

    def _start_ray(self) -> None:
        from fleetrl.cluster.ray_cluster import RayCluster

        config, placement = self.config, self.layout.placement
        self.ray = RayCluster(config.cluster, placement.devices_per_node)
        log.info("starting %s", ", ".join(f"{placement.world_size(c)} {c}" for c in ("env", "rollout", "actor")))
        self.env = self.ray.create_group(placement.ranks("env"), EnvWorker, self.env_worker_args)
        self.observation_space, self.action_space = self.env.get(self.env.call(0, "spaces"))
        spaces = (self.observation_space, self.action_space)
        world = placement.world_size("actor")
        workers = algorithm_workers(config.algorithm.name)
        self.actor = self.ray.create_group(placement.ranks("actor"), workers.actor,
                                           lambda rank: (config, *spaces, rank, world))
        self.rollout = self.ray.create_group(placement.ranks("rollout"), workers.rollout.from_config,
                                             lambda rank: (config, *spaces))
        if world > 1:
            address = self.ray.node_ip(placement.ranks("actor")[0].node)
            port = self.actor.get(self.actor.handles[0].free_port.remote(address))
            log.info("actor process group: %d ranks, rendezvous at %s:%d", world, address, port)
            self.actor.get(self.actor.call_all("init_distributed", address, port))

    def shutdown(self) -> None:
        """Close the simulators first (they may own subprocesses), then stop Ray if started."""
        self.env.get(self.env.call_all("close"))
        if self.ray is not None:
            self.ray.shutdown()
            self.ray = None
