"""From the config to what will run where: placement, backend, processes, lanes, env worker args.

Pure: every function here reads the config (and the machine's device and CPU counts) and returns
values or raises `ConfigError`; nothing is started, nothing imports Ray or torch at import (the
controller unpickles a `Layout` before it imports torch). `plan.resolve` places the components
(`place`), runs the rules that need the placement (plan/rules.py) and picks the backend
(`choose_backend`), so `--dry-run`, the benchmarks and the backends all see the same plan, and
every layout error surfaces before a single process exists.

Backends (cluster/backends/base.py): `inline` (every component in this process), `ray` (one Ray actor
per rank of each component), `fused` (on Ray, one process per rank holding its env, rollout and
actor; `cluster.fuse_collocated`). The eval worker (`runner.eval_interval` > 0) is placed like
the other components; inline it is an object of this process, on Ray a Ray actor of its own (never
fused: its evaluations run beside training, not inside a rank's iteration).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, replace
from typing import Literal

from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError
from fleetrl.plan.placement import EVAL, Assignment, Placement, check_divisible, resolve_placement

BackendName = Literal["inline", "ray", "fused"]
FUSED = "fused"  # the component name of a fused rank's process (heartbeats, reports)
FUSE_KEY = "cluster.fuse_collocated"


@dataclass(frozen=True)
class Layout:
    placement: Placement
    backend: BackendName

    @property
    def runs_on(self) -> str:
        """Where the processes live: 'inline' (this one) or 'ray' (fused ranks are Ray actors too)."""
        return "inline" if self.backend == "inline" else "ray"


@dataclass(frozen=True)
class Lane:
    env_rank: int
    stage: int
    rollout_rank: int
    index: int  # position among the lanes of its rollout worker


# Present when an NVIDIA (/proc/driver/nvidia, /dev/nvidiactl) or ROCm (/dev/kfd) GPU driver is loaded
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")


def gpu_driver_loaded() -> bool:
    """Whether torch could see a GPU at all: without a driver it sees none, and a host without
    one is answered without importing torch (seconds of every supervisor's and doctor's start)."""
    return any(os.path.exists(path) for path in GPU_DRIVER_PATHS)


def detect_devices_per_node() -> int:
    """The GPUs torch sees, or the CPUs when none."""
    if gpu_driver_loaded():
        import torch

        if count := torch.cuda.device_count():
            return count
    return os.cpu_count() or 1


def place(config: Config) -> Placement:
    """The placement of `config`'s components, the envs and trajectories split evenly over it."""
    cluster = config.cluster
    devices = cluster.devices_per_node or detect_devices_per_node()
    evaluates = config.runner.eval_interval > 0
    placement = resolve_placement(
        cluster.num_nodes, devices, cluster.component_placement, os.cpu_count(), evaluates=evaluates
    )
    check_data_layout(config, placement)
    return placement


def choose_backend(config: Config, placement: Placement) -> Layout:
    """The backend `cluster.backend` names ('auto': inline when every component has one rank on
    one node), checked against the placement, fusing and the env ⇄ rollout exchange."""
    cluster = config.cluster
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
    if backend == "ray" and cluster.fuse_collocated:
        check_fusable(config, placement)
        backend = FUSED
    if cluster.exchange in ("compiled", "direct") and backend != "ray":
        raise ConfigError(
            "cluster.exchange",
            cluster.exchange,
            "'auto' or 'classic' on this layout",
            f"A {cluster.exchange} exchange links env and rollout workers that are Ray actors of their own; here they share "
            f"one process ({'a fused rank' if backend == FUSED else 'the inline backend'})",
        )
    return Layout(placement, backend)


def check_data_layout(config: Config, placement: Placement) -> None:
    """Envs split evenly over env ranks and stages, and each stage into whole reset groups
    (`algorithm.reset_group_size`); trajectories evenly over actor ranks."""
    env_world, stages = placement.world_size("env"), config.rollout.pipeline_stage_num
    check_divisible(placement, "env", "env.num_envs", config.env.num_envs)
    if (config.env.num_envs // env_world) % stages:
        raise ConfigError(
            "rollout.pipeline_stage_num",
            stages,
            f"a divisor of the envs per env worker ({config.env.num_envs // env_world})",
        )
    per_stage, group = config.env.num_envs // env_world // stages, config.algorithm.reset_group_size
    if per_stage % group:
        raise ConfigError(
            "algorithm.group_size",
            group,
            f"a divisor of the envs per env worker stage ({per_stage}): a group of envs is reset together",
        )
    check_divisible(placement, "actor", "env.num_envs", config.env.num_envs)
    rollout_world = placement.world_size("rollout")
    if env_world % rollout_world:
        raise ConfigError(
            "cluster.component_placement.rollout",
            rollout_world,
            f"a rollout world size dividing the env world size ({env_world})",
        )


def check_fusable(config: Config, placement: Placement) -> None:
    """Fusing needs rank r of env, rollout and actor on one device, for every r, and a policy
    that can run inference without collectives (not FSDP shards)."""
    env, rollout, actor = (placement.ranks(c) for c in ("env", "rollout", "actor"))
    if not len(env) == len(rollout) == len(actor):
        raise ConfigError(
            FUSE_KEY,
            True,
            "false, or a placement with as many env and rollout ranks as "
            f"actor ranks (here env {len(env)}, rollout {len(rollout)}, actor {len(actor)})",
        )
    for e, r, a in zip(env, rollout, actor):
        if not e.device == r.device == a.device:
            raise ConfigError(
                FUSE_KEY,
                True,
                "false, or a placement where rank r of env, rollout and "
                f"actor share a device (rank {a.rank}: env on device {e.device}, rollout on "
                f"{r.device}, actor on {a.device})",
            )
    if config.actor.strategy == "fsdp" and len(actor) > 1:
        raise ConfigError(
            FUSE_KEY,
            True,
            "false with actor.strategy 'fsdp': inference on FSDP shards "
            "would gather parameters collectively at every env step",
        )


def fused_assignments(placement: Placement, cpu_count_per_node: int | None) -> list[Assignment]:
    """One process per actor rank, where the actor rank runs. The placement split each node's
    CPUs among env, rollout and actor processes; fused, only the ranks' processes share them."""
    actors = placement.ranks("actor")
    ranks_on_node = Counter(a.node for a in actors)
    return [
        replace(
            a,
            component=FUSED,
            cpu_threads=max(1, cpu_count_per_node // ranks_on_node[a.node]) if cpu_count_per_node else a.cpu_threads,
        )
        for a in actors
    ]


def worker_processes(layout: Layout) -> list[Assignment]:
    """The worker processes a Ray-hosted backend starts: one per fused rank (and the eval
    worker), or one per rank of each component."""
    placement = layout.placement
    if layout.backend == FUSED:
        own = placement.ranks(EVAL) if placement.placed(EVAL) else []
        return fused_assignments(placement, os.cpu_count()) + own
    return list(placement.assignments)


def dry_run_text(layout: Layout) -> str:
    """What `fleetrl train --dry-run` prints: the backend, the placement, fused processes."""
    fused = layout.backend == FUSED
    lines = [
        f"backend: {layout.runs_on}" + (" (fused: rank r of env, rollout and actor in one process)" if fused else ""),
        layout.placement.table(),
    ]
    if fused:
        lines.append(
            "processes: "
            + ", ".join(
                f"{a.component} rank {a.rank} on node {a.node} device {a.local_device} (torch threads: {a.cpu_threads})"
                for a in worker_processes(layout)
            )
        )
    return "\n".join(lines)


def plan_lanes(env_world: int, rollout_world: int, stages: int) -> list[Lane]:
    """Env ranks are split into contiguous blocks, one block per rollout rank; lanes are listed
    in global env order (env rank, then stage), which is the order trajectories are joined in."""
    per_rollout = env_world // rollout_world
    lanes, next_index = [], [0] * rollout_world
    for env_rank in range(env_world):
        rollout_rank = env_rank // per_rollout
        for stage in range(stages):
            lanes.append(Lane(env_rank, stage, rollout_rank, next_index[rollout_rank]))
            next_index[rollout_rank] += 1
    return lanes


def lane_sizes(config: Config, placement: Placement) -> list[list[int]]:
    """Per rollout rank, the number of envs in each of its lanes (in lane order)."""
    stages = config.rollout.pipeline_stage_num
    lane_size = config.env.num_envs // placement.world_size("env") // stages
    sizes: list[list[int]] = [[] for _ in range(placement.world_size("rollout"))]
    for lane in plan_lanes(placement.world_size("env"), placement.world_size("rollout"), stages):
        sizes[lane.rollout_rank].append(lane_size)
    return sizes


def env_worker_args(config: Config, placement: Placement, rank: int) -> tuple:
    """`EnvWorker(*args)` of env rank `rank`: its share of the envs, seeded by its first env."""
    per_rank = config.env.num_envs // placement.world_size("env")
    return (
        config.env,
        config.algorithm.gamma,
        config.runner.seed + rank * per_rank,
        per_rank,
        True,
        config.rollout.pipeline_stage_num,
        config.algorithm.reset_group_size,
        config.model.action_chunk,
    )
