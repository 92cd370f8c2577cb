"""The inline backend: env, rollout and actor as objects of the controller's own process.

One process, watched as `inline rank 0`: its own flight recorder stands for all three
components, and every call still runs as a recorded phase (`env.step`, `actor.train`) with
`debug.fault` injected where it says. The rollout worker holds the actor's own policy object, so
there is nothing to sync. The eval worker, when the run evaluates, is an object here too: its
evaluations run between iterations (`eval.run`; training waits for them), and it is built
without touching this process's random streams, which training draws from.
"""

from __future__ import annotations

import contextlib

import torch

from fleetrl.cluster.backends.base import Backend, Workers, close_evaluator
from fleetrl.cluster.exchange.collect import Collector, CollectThenTrain
from fleetrl.cluster.groups import InlineGroup
from fleetrl.debug.faults import FaultPlan
from fleetrl.plan.layout import env_worker_args
from fleetrl.plan.placement import EVAL
from fleetrl.plan.run_plan import RunPlan
from fleetrl.probe.recorded_calls import RecordedCalls
from fleetrl.watch.session import WatchSession
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.eval_worker import EvalWorker
from fleetrl.workers.rollout_worker import rollout_dtype

INLINE = "inline"  # the component name of this process in heartbeats and reports


class InlineBackend(Backend):
    shares_policy = True

    @classmethod
    def start(cls, plan: RunPlan, session: WatchSession, undo: contextlib.ExitStack) -> InlineBackend:
        config, placement = plan.config, plan.placement
        spec = session.open_store("127.0.0.1")
        recorder = session.watch_here(INLINE, 0, spec)
        session.start([{"component": INLINE, "rank": 0, "node": 0}])

        def group(component: str, worker) -> InlineGroup:
            calls = RecordedCalls(worker, component, 0, recorder, FaultPlan(config.debug.fault, component, 0))
            return InlineGroup(placement.ranks(component), [worker], [calls])

        with recorder.in_phase("env.construct"):  # a watched start-up step, like every worker's on Ray
            env = EnvWorker(*env_worker_args(config, placement, 0))
        undo.callback(env.close)
        spaces = env.observation_space, env.action_space
        plan.check_spaces(*spaces)
        actor = plan.spec.actor_class()(config, *spaces)
        env_group, actor_group = group("env", env), group("actor", actor)
        rollout_group = group("rollout", plan.spec.rollout_class()(actor.policy, dtype=rollout_dtype(config)))
        collector = Collector(env_group, rollout_group, config.rollout.pipeline_stage_num, config.algorithm.num_steps)
        evaluator = None
        if placement.placed(EVAL):
            with torch.random.fork_rng(devices=[]):  # its policy's initialisation draws from torch's
                evaluator = group(EVAL, EvalWorker.for_training(config))
            undo.callback(close_evaluator, evaluator)
        iterations = CollectThenTrain(collector, actor_group)
        return cls(session, Workers(env_group, rollout_group, actor_group, spaces, evaluator), iterations)

    def close(self) -> None:
        """Nothing beyond the workers: this process is the backend."""
