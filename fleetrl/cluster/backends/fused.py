"""The fused backend: rank r of env, rollout and actor in one Ray worker process.

With `cluster.fuse_collocated: true` and a placement that puts rank r of all three components on
one device (plan/layout.py `check_fusable`), each rank is a single Ray actor holding its env
worker, a rollout worker that reads the actor's own policy, and its actor rank. An iteration is
then one call per rank — collect locally, then train (the DDP group reduces across ranks) —
instead of two controller calls per env step: a Ray call costs ~1.3 ms, more than a CartPole or
HalfCheetah step and its inference together. No weight sync is needed (the rollout worker uses
the actor's parameters).

The eval worker, when the run evaluates, is not fused: a Ray actor of its own (as on the Ray
backend), so its episodes run while the ranks train.

The controller still sees three groups (views of the same actors, `RayGroup.view`), so
checkpoints, resume, replica checks and reports are unchanged; inside the process each
component's calls run through its own `RecordedCalls`, so phases read `env.step` or `actor.train`
and `debug.fault` hits the component it names. The watchdog watches one process per rank,
`fused rank r`, and reports name it with the phase it was in ("fused rank 1 raised ValueError in
env.step").
"""

from __future__ import annotations

import contextlib
import os
from functools import partial

import torch

from fleetrl.algos.registry import algorithm_spec
from fleetrl.cluster.backends.base import Workers, close_envs
from fleetrl.cluster.backends.ray import RayBackend, connect, join_actor_ranks, start_evaluator, watched
from fleetrl.cluster.exchange.collect import Collector, CollectThenTrain
from fleetrl.cluster.groups import InlineGroup, RayGroup
from fleetrl.cluster.ray.worker_host import FusedHost
from fleetrl.config.schema import Config
from fleetrl.debug.faults import FaultPlan
from fleetrl.plan.layout import FUSED, env_worker_args, fused_assignments
from fleetrl.plan.run_plan import RunPlan
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.probe.recorded_calls import RecordedCalls
from fleetrl.signals import hold_stops
from fleetrl.watch.session import WatchSession
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import rollout_dtype, rollout_seed


class FusedRank:
    """In the worker process: the rank's env worker from the start; its actor and rollout worker
    once the controller has checked the env's spaces (`build_learner`). Called as
    `component.method` ('env.report', 'fused.iterate'), each through that component's RecordedCalls."""

    def __init__(
        self, config: Config, env_args: tuple, rank: int, world_size: int, recorder: Recorder, fault_spec: dict
    ):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.recorder, self.fault_spec = recorder, fault_spec
        self.calls: dict[str, RecordedCalls] = {FUSED: self.recorded_calls(FUSED, self)}
        with recorder.in_phase("env.construct"):  # the start-up step that runs the user's env constructors
            env = EnvWorker(*env_args)
        self.env: InlineGroup = self.inline_group("env", env)
        self.iterations: CollectThenTrain | None = None  # once the learner is built

    def recorded_calls(self, component: str, worker) -> RecordedCalls:
        return RecordedCalls(
            worker, component, self.rank, self.recorder, FaultPlan(self.fault_spec, component, self.rank), process=FUSED
        )

    def inline_group(self, component: str, worker) -> InlineGroup:
        self.calls[component] = self.recorded_calls(component, worker)
        return InlineGroup([], [worker], [self.calls[component]])

    def __call__(self, qualified_name: str, *args):
        """Run `component.method` as a recorded phase of that component."""
        component, name = qualified_name.split(".", 1)
        return self.calls[component](name, *args)

    def build_learner(self, observation_space, action_space) -> None:
        spec = algorithm_spec(self.config.algorithm.name)
        actor = spec.actor_class()(self.config, observation_space, action_space, self.rank, self.world_size)
        if self.world_size > 1:  # the actor drew identical weights from the run's seed; actions need distinct noise
            torch.manual_seed(rollout_seed(self.config.runner.seed, self.rank))
        actor_group = self.inline_group("actor", actor)
        rollout = self.inline_group("rollout", spec.rollout_class()(actor.policy, dtype=rollout_dtype(self.config)))
        collector = Collector(
            self.env, rollout, self.config.rollout.pipeline_stage_num, self.config.algorithm.num_steps
        )
        self.iterations = CollectThenTrain(collector, actor_group)

    def start_collecting(self, epoch: int) -> None:
        self.iterations.start(epoch)

    def iterate(self, progress: float) -> tuple[dict, float]:
        """Collect this rank's envs for one iteration, then train on them with the other ranks.
        Returns the (cross-rank reduced) metrics and the seconds spent collecting."""
        return self.iterations.collect_and_train(progress)


class FusedIterations:
    """The controller's collector when ranks are fused: each rank collects inside `iterate`."""

    def __init__(self, fused: RayGroup):
        self.fused: RayGroup = fused

    def start(self, epoch: int) -> None:
        self.fused.get(self.fused.call_all(FusedRank.start_collecting, epoch))

    def collect_and_train(self, progress: float) -> tuple[dict, float]:
        """Rank 0's metrics (reduced across ranks: the same on each) and the slowest collection.
        A stop meanwhile waits for the iteration's end (fleetrl/signals.py): the ranks collect and
        update in their own processes whatever the controller does, and the checkpoint's calls
        would queue behind them."""
        hold_stops()
        results = self.fused.get(self.fused.call_all(FusedRank.iterate, progress))
        return results[0][0], max(collect_s for _, collect_s in results)


class FusedBackend(RayBackend):
    shares_policy = True

    @classmethod
    def start(cls, plan: RunPlan, session: WatchSession, undo: contextlib.ExitStack) -> FusedBackend:
        """One Ray actor per rank that will hold its env, rollout and actor: the env first, so
        that the spaces are checked before any learner is built."""
        config, placement, world = plan.config, plan.placement, plan.placement.world_size("actor")
        cluster, spec = connect(plan, session, undo, " (fused: one process per rank)")
        ranks = fused_assignments(placement, os.cpu_count())
        session.start(watched(ranks, placement), cluster)  # from before the ranks exist: their start-up is watched
        fused = cluster.create_group(
            ranks,
            FusedRank,
            lambda rank: (config, env_worker_args(config, placement, rank), rank, world),
            spec,
            session.interrupt,
            host_class=FusedHost,
            prefix=f"{FUSED}.",
        )
        env = fused.view("env", EnvWorker)
        rollout = fused.view("rollout", plan.spec.rollout_class())
        actor = fused.view("actor", plan.spec.actor_class())
        undo.callback(close_envs, env)
        spaces = env.get(env.call(0, EnvWorker.spaces))
        plan.check_spaces(*spaces)
        create = partial(cluster.create_group, watch=spec, interrupt=session.interrupt)
        evaluator = start_evaluator(plan, create, undo)
        if evaluator is not None:  # built now: a broken one fails the start at once, not the first evaluation
            evaluator.built()
        fused.get(fused.call_all(FusedRank.build_learner, *spaces))
        join_actor_ranks(cluster, actor)
        return cls(session, Workers(env, rollout, actor, spaces, evaluator), FusedIterations(fused), cluster)
