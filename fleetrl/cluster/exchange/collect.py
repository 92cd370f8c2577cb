"""Env ⇄ rollout for T steps, pipelined over lanes.

A *lane* is one pipeline stage of one env worker, served by one rollout worker. For every step
each lane runs `rollout.act(lane, t, step)` then `env.step(actions, stage)`. How those calls
travel is the collector's *exchange*: by default (`QueuedCalls`) the controller queues them,
passing futures rather than waiting for results; each worker runs its calls in order as inputs
arrive, so while an env worker steps stage i, its rollout worker is already inferring stage i+1.
On the inline backend the same calls simply run one after another. On Ray the backend may
exchange through a compiled graph instead (cluster/exchange/compiled.py): same calls, same order.

`CollectThenTrain` is one iteration — collect, then train the actor group on it — wherever the
collecting process is: the controller (inline and Ray backends) or a fused rank's own process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from fleetrl.cluster.groups import WorkerGroup
from fleetrl.observations import map_obs
from fleetrl.plan.layout import Lane, plan_lanes
from fleetrl.signals import hold_stops
from fleetrl.step_result import StepResult
from fleetrl.trajectory import Trajectory
from fleetrl.workers.actor_base import ActorBase
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker


class Exchange(Protocol):
    """How env ⇄ rollout calls travel for steps 0..T-1 of every lane."""

    def run(self, pending: dict[Lane, object], steps: int) -> None:
        """From each lane's last env outcome in `pending` (a value or a future), run `steps` steps;
        leave each lane's newest outcome in `pending`."""


class QueuedCalls:
    """The classic exchange: two calls per lane and step, queued by the controller with futures
    as arguments (no waiting), run by each worker in submission order."""

    def __init__(self, env: WorkerGroup, rollout: WorkerGroup, lanes: list[Lane]):
        self.env, self.rollout, self.lanes = env, rollout, lanes

    def run(self, pending: dict[Lane, object], steps: int) -> None:
        rollout, env, act, step = self.rollout, self.env, RolloutWorker.act, EnvWorker.step
        for t in range(steps):
            for lane in self.lanes:
                actions = rollout.call(lane.rollout_rank, act, lane.index, t, pending[lane])
                pending[lane] = env.call(lane.env_rank, step, actions, lane.stage)


ExchangeFactory = Callable[[WorkerGroup, WorkerGroup, list[Lane]], Exchange]


class Collector:
    def __init__(
        self,
        env_group: WorkerGroup,
        rollout_group: WorkerGroup,
        stages: int,
        steps: int,
        exchange: ExchangeFactory = QueuedCalls,
    ):
        self.env, self.rollout, self.steps, self.stages = env_group, rollout_group, steps, stages
        self.lanes: list[Lane] = plan_lanes(env_group.world_size, rollout_group.world_size, stages)
        self.pending: dict[Lane, object] = {}  # each lane's latest env outcome (a value or a future)
        self.exchange: Exchange = exchange(env_group, rollout_group, self.lanes)

    def start(self, epoch: int) -> None:
        """Reset every env worker; the reset observations open each lane."""
        observations = self.env.get(self.env.call_all(EnvWorker.reset, epoch))
        for lane in self.lanes:
            stage_obs = map_obs(
                lambda x, stage=lane.stage: np.split(x, self.stages)[stage], observations[lane.env_rank]
            )
            self.pending[lane] = StepResult.initial(stage_obs)

    def collect(self) -> Trajectory:
        rollout, act = self.rollout, RolloutWorker.act
        self.exchange.run(self.pending, self.steps)
        closing = [
            rollout.call(lane.rollout_rank, act, lane.index, self.steps, self.pending[lane]) for lane in self.lanes
        ]
        rollout.get(closing)
        return Trajectory.concatenate(rollout.get(rollout.call_all(RolloutWorker.trajectory)))


class Iterations(Protocol):
    """How the runner drives one iteration, wherever collection happens."""

    def start(self, epoch: int) -> None:
        """Reset the envs (epoch shifts their seeds); the next collection starts from there."""

    def collect_and_train(self, progress: float) -> tuple[dict, float]:
        """Collect one iteration and train on it; the metrics and the seconds spent collecting."""


class CollectThenTrain:
    """`Iterations` run from one process: its collector drives env ⇄ rollout, then the actor
    group trains, rank r on shard r of the trajectory (the controller), or one rank on what its
    own process collected (a fused rank)."""

    def __init__(self, collector: Collector, actor: WorkerGroup):
        self.collector: Collector = collector
        self.actor: WorkerGroup = actor

    def start(self, epoch: int) -> None:
        self.collector.start(epoch)

    def collect_and_train(self, progress: float) -> tuple[dict, float]:
        started = time.perf_counter()
        trajectory = self.collector.collect()
        collect_s = time.perf_counter() - started
        return self.train(trajectory, progress), collect_s

    def train(self, trajectory: Trajectory, progress: float) -> dict:
        # A stop from here on waits for the iteration's end (fleetrl/signals.py): inline, it would
        # otherwise land inside the update and leave the weights half-updated beside the counters
        # of the iteration before; on Ray the actors' update goes on whatever the controller does,
        # and the checkpoint's calls would queue behind it. So a stop saves a whole iteration.
        hold_stops()
        actor, world = self.actor, self.actor.world_size
        futures = [actor.call(rank, ActorBase.train, trajectory.shard(rank, world), progress) for rank in range(world)]
        return actor.get(futures)[0]  # metrics are reduced across ranks: identical on each
