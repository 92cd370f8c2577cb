"""The Ray backend: one pinned Ray actor per rank of each component, driven from this process.

Start-up order is the invariant that keeps errors cheap and everything watched: the watchdog
first, over every worker the layout places (each one's start-up steps — its construction, the
spaces, the process-group join — are watched phases, so a constructor that hangs is reported);
then env workers, so the env's spaces are checked (`RunPlan.check_spaces`) before any learner is built;
while the env worker answers `spaces`, the actor and rollout workers' processes start and import
(cluster/ray/worker_host.py: the processes first, the workers once the spaces are checked — their
start-up no longer waits behind the env's); then the actor and rollout workers (and the eval
worker, when the run evaluates: a Ray actor of its own, so that its episodes run while training
goes on); then the actor ranks' process group, and with `runner.weight_sync_transport: collective`
the weight-sync group of actor rank 0 and the rollout workers (cluster/ray/sync_group.py); last
the env ⇄ rollout exchange (the direct channels unless `cluster.exchange` names another:
cluster/exchange/choose.py `choose_exchange`). `connect`,
`start_evaluator` and `join_actor_ranks` are shared with the fused backend (cluster/backends/fused.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from functools import partial

from fleetrl.cluster.backends.base import Backend, Workers, close_envs, close_evaluator
from fleetrl.cluster.exchange.choose import choose_exchange
from fleetrl.cluster.exchange.collect import Collector, CollectThenTrain, Iterations
from fleetrl.cluster.groups import RayGroup
from fleetrl.cluster.ray.cluster import RayCluster, build_workers
from fleetrl.cluster.ray.sync_group import form_sync_group
from fleetrl.plan.layout import env_worker_args
from fleetrl.plan.placement import EVAL, Assignment, Placement
from fleetrl.plan.run_plan import RunPlan
from fleetrl.probe.recorded_calls import WatchSpec
from fleetrl.watch.session import WatchSession
from fleetrl.workers.actor_base import ActorBase
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.eval_worker import EvalWorker

log = logging.getLogger("fleetrl")


class RayBackend(Backend):
    shares_policy = False

    def __init__(self, session: WatchSession, workers: Workers, collector: Iterations, cluster: RayCluster):
        super().__init__(session, workers, collector)
        self.cluster: RayCluster = cluster

    @classmethod
    def start(cls, plan: RunPlan, session: WatchSession, undo: contextlib.ExitStack) -> RayBackend:
        config, placement, world = plan.config, plan.placement, plan.placement.world_size("actor")
        cluster, spec = connect(plan, session, undo)
        session.start(
            watched([*placement.ranks("env"), *placement.ranks("rollout"), *placement.ranks("actor")], placement),
            cluster,
        )
        create = partial(cluster.create_group, watch=spec, interrupt=session.interrupt)
        env = create(placement.ranks("env"), EnvWorker, partial(env_worker_args, config, placement))
        undo.callback(close_envs, env)
        spaces_future = env.call(0, EnvWorker.spaces)
        # Meanwhile the learners' processes start and import (their constructors need the spaces)
        start = partial(cluster.start_processes, watch=spec, interrupt=session.interrupt)
        actor_class, rollout_class = plan.spec.actor_class(), plan.spec.rollout_class()
        actor = start(placement.ranks("actor"), actor_class)
        rollout = start(placement.ranks("rollout"), rollout_class, factory=rollout_class.from_config)
        spaces = env.get(spaces_future)
        plan.check_spaces(
            *spaces
        )  # e.g. discrete actions for a continuous-only algorithm: a config error, no learner built
        build_workers(actor, lambda rank: (config, *spaces, rank, world))
        build_workers(rollout, lambda rank: (config, *spaces))
        evaluator = start_evaluator(plan, create, undo)
        if evaluator is not None:  # built now: a broken one fails the start at once, not the first evaluation
            evaluator.built()
        join_actor_ranks(cluster, actor)
        collective = config.runner.weight_sync_transport == "collective" and form_sync_group(
            cluster, actor, rollout, config
        )
        exchange = choose_exchange(
            config.cluster.exchange, config.algorithm.num_steps, session.interrupt, cluster.before_shutdown.append
        )
        collector = Collector(env, rollout, config.rollout.pipeline_stage_num, config.algorithm.num_steps, exchange)
        backend = cls(
            session, Workers(env, rollout, actor, spaces, evaluator), CollectThenTrain(collector, actor), cluster
        )
        backend.sync_transport = "collective" if collective else "ray"
        return backend

    def close(self) -> None:
        self.cluster.shutdown()


def connect(
    plan: RunPlan, session: WatchSession, undo: contextlib.ExitStack, note: str = ""
) -> tuple[RayCluster, WatchSpec]:
    """Connect to (or start) Ray, under a start-up deadline; host the heartbeat store where the
    workers reach this process; log what will start (and `note`)."""
    placement = plan.placement
    cluster = RayCluster(plan.config.cluster, placement.devices_per_node, session.deadline)
    undo.callback(cluster.shutdown)
    spec = session.open_store(cluster.controller_ip())
    components = [c for c in ("env", "rollout", "actor", EVAL) if placement.placed(c)]
    placed = ", ".join(f"{placement.world_size(c)} {c}" for c in components)
    log.info("starting %s%s", placed, note)
    return cluster, spec


def start_evaluator(plan: RunPlan, create: Callable[..., RayGroup], undo: contextlib.ExitStack) -> RayGroup | None:
    """The eval worker, a Ray actor of its own where `component_placement.eval` puts it; None
    when the run does not evaluate. `create` is `RayCluster.create_group` with the watch spec."""
    if not plan.placement.placed(EVAL):
        return None
    config = plan.config
    evaluator = create(plan.placement.ranks(EVAL), EvalWorker, lambda rank: (config,), factory=EvalWorker.for_training)
    undo.callback(close_evaluator, evaluator)
    return evaluator


def watched(assignments: list[Assignment], placement: Placement) -> list[dict]:
    """The workers to watch from before their creation: `assignments` and the eval worker, if placed."""
    evaluators = placement.ranks(EVAL) if placement.placed(EVAL) else []
    return [{"component": a.component, "rank": a.rank, "node": a.node} for a in [*assignments, *evaluators]]


def join_actor_ranks(cluster: RayCluster, actor: RayGroup) -> None:
    """With several actor ranks, join them into one process group, rendezvous on rank 0's node."""
    if actor.world_size == 1:
        return
    address = cluster.node_ip(actor.assignments[0].node)
    port = actor.get(actor.handles[0].free_port.remote(address))
    log.info("actor process group: %d ranks, rendezvous at %s:%d", actor.world_size, address, port)
    actor.get(actor.call_all(ActorBase.init_distributed, address, port))
