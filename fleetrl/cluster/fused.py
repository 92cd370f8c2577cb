"""Fused ranks: rank r of env, rollout and actor in one Ray worker process.

With `cluster.fuse_collocated: true` and a placement that puts rank r of all three components on
one device, each rank is a single Ray actor holding its env worker, a rollout worker that reads
the actor's own policy, and its actor rank. An iteration is then one call per rank — collect
locally, then train (the DDP group reduces across ranks) — instead of two controller calls per env
step: a Ray call costs ~1.3 ms, more than a CartPole or HalfCheetah step and its inference
together. No weight sync is needed (the rollout worker uses the actor's parameters).

The controller still sees three groups (`ComponentView`s over the same actors), so checkpoints,
resume, replica checks and reports are unchanged; inside the process each component's calls run
through its own `CallRunner`, so phases read `env.step` or `actor.train` and `debug.fault` hits
the component it names. The watchdog watches one process per rank, `fused rank r`, and reports
name it with the phase it was in ("fused rank 1 raised ValueError in env.step").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import partial

import torch

from fleetrl.algos.registry import algorithm_spec
from fleetrl.cluster.groups import InlineGroup, RayGroup
from fleetrl.cluster.placement import Assignment, Placement
from fleetrl.collect import Collector, collect_then_train
from fleetrl.config.schema import Config
from fleetrl.errors import ConfigError
from fleetrl.watch.faults import FaultPlan
from fleetrl.watch.flight_recorder import Recorder
from fleetrl.watch.host import CallRunner
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import rollout_seed

FUSED = "fused"
FUSE_KEY = "cluster.fuse_collocated"


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


class FusedRank:
    """In the worker process: the rank's env worker from the start; its actor and rollout worker
    once the controller has checked the env's spaces (`build_learner`)."""

    def __init__(
        self, config: Config, env_args: tuple, rank: int, world_size: int, recorder: Recorder, fault_spec: dict
    ):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.recorder, self.fault_spec = recorder, fault_spec
        self.runners = {FUSED: self.runner(FUSED, self)}
        self.env = self.inline_group("env", EnvWorker(*env_args))
        self.collector: Collector | None = None

    def runner(self, component: str, worker) -> CallRunner:
        return CallRunner(
            worker, component, self.rank, self.recorder, FaultPlan(self.fault_spec, component, self.rank), process=FUSED
        )

    def inline_group(self, component: str, worker) -> InlineGroup:
        self.runners[component] = self.runner(component, worker)
        return InlineGroup([], [worker], [self.runners[component]])

    def __call__(self, qualified_method: str, *args):
        """Run `component.method` (e.g. 'env.report', 'fused.iterate') as a recorded phase."""
        component, method = qualified_method.split(".", 1)
        return self.runners[component](method, *args)

    def build_learner(self, observation_space, action_space) -> None:
        workers = algorithm_spec(self.config.algorithm.name)
        actor = workers.actor(self.config, observation_space, action_space, self.rank, self.world_size)
        if self.world_size > 1:  # the actor drew identical weights from the run's seed; actions need distinct noise
            torch.manual_seed(rollout_seed(self.config.runner.seed, self.rank))
        self.inline_group("actor", actor)
        rollout = self.inline_group("rollout", workers.rollout(actor.policy))
        self.collector = Collector(
            self.env, rollout, self.config.rollout.pipeline_stage_num, self.config.algorithm.num_steps
        )

    def start_collecting(self, epoch: int) -> None:
        self.collector.start(epoch)

    def iterate(self, progress: float) -> tuple[dict, float]:
        """Collect this rank's envs for one iteration, then train on them with the other ranks.
        Returns the (cross-rank reduced) metrics and the seconds spent collecting."""
        return collect_then_train(self.collector, partial(self.runners["actor"], "train"), progress)


class ComponentView:
    """One component's face of the fused ranks for the controller: `call(rank, 'step')` runs
    `env.step` in rank's process. Named, waited on and interrupted like the fused group."""

    def __init__(self, fused: RayGroup, component: str):
        self.fused, self.component = fused, component

    @property
    def world_size(self) -> int:
        return self.fused.world_size

    @property
    def assignments(self) -> list[Assignment]:
        return self.fused.assignments

    @property
    def handles(self) -> list:
        return self.fused.handles

    def call(self, rank: int, method: str, *args):
        return self.fused.call(rank, f"{self.component}.{method}", *args)

    def call_all(self, method: str, *args) -> list:
        return [self.call(rank, method, *args) for rank in range(self.world_size)]

    def get(self, futures):
        return self.fused.get(futures)


class FusedCollector:
    """The controller's collector when ranks are fused: each rank collects inside `iterate`."""

    def __init__(self, fused: RayGroup):
        self.fused = fused

    def start(self, epoch: int) -> None:
        self.fused.get(self.fused.call_all("fused.start_collecting", epoch))

    def collect_and_train(self, progress: float) -> tuple[dict, float]:
        """Rank 0's metrics (reduced across ranks: the same on each) and the slowest collection."""
        results = self.fused.get(self.fused.call_all("fused.iterate", progress))
        return results[0][0], max(collect_s for _, collect_s in results)
