"""What the runner sees of where the workers run: three worker groups, a collector, one flag.

Every backend (cluster/backends/: inline.py, ray.py, fused.py) presents the same
`Backend`: the env, rollout and actor groups (called with the worker classes' methods), the
`collector` that runs one collect-then-train iteration, `shares_policy` (the rollout workers act
with the actor's own policy object: no weight sync), `sync_transport` (how weights reach rollout
workers of their own: "ray", or "collective" once the weight-sync group is formed), `evaluator` (the eval worker's group when the
run evaluates, else None), `fail(error)` and `shutdown()`. The runner never asks which backend it
has; `cluster/start.py` picks and starts one.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NoReturn

import gymnasium as gym

from fleetrl.cluster.exchange.collect import Iterations
from fleetrl.cluster.groups import WorkerGroup
from fleetrl.plan.run_plan import RunPlan
from fleetrl.probe.child_activity import end_descendants
from fleetrl.watch.session import WatchSession
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.eval_worker import EvalWorker


@dataclass(frozen=True)
class Workers:
    """The groups a backend started, and the env's spaces (asked of env rank 0 once)."""

    env: WorkerGroup
    rollout: WorkerGroup
    actor: WorkerGroup
    spaces: tuple[gym.Space, gym.Space]
    evaluator: WorkerGroup | None = None  # the eval worker, when runner.eval_interval > 0


class Backend(ABC):
    shares_policy: bool = False  # rollout acts with the actor's own policy object (one process)
    sync_transport: str = "ray"  # "collective": over the weight-sync group (parallel/sync_group.py)
    spare: frozenset[int] = frozenset()  # this process's descendants before the workers: not theirs to end

    def __init__(self, session: WatchSession, workers: Workers, collector: Iterations):
        self.session: WatchSession = session
        self.env: WorkerGroup = workers.env
        self.rollout: WorkerGroup = workers.rollout
        self.actor: WorkerGroup = workers.actor
        self.observation_space, self.action_space = workers.spaces
        self.evaluator: WorkerGroup | None = workers.evaluator
        self.collector: Iterations = collector

    @classmethod
    @abstractmethod
    def start(cls, plan: RunPlan, session: WatchSession, undo: contextlib.ExitStack) -> Backend:
        """Build and watch the workers `plan` places (checking only the env's spaces, which the
        plan could not: `RunPlan.check_spaces`); push onto `undo` how to close each thing started."""

    def fail(self, error: BaseException) -> NoReturn:
        """A worker's error reached the controller: report it as an incident, tear down, raise
        IncidentStop."""
        self.session.fail(error)

    def shutdown(self) -> None:
        """Stop the threads that use the heartbeat store, close the simulators (they may own
        subprocesses; an evaluation still running finishes first), then whatever the backend
        itself holds — unless an incident already ended every worker. Then end what the
        simulators left running: every descendant of this process that was not there before the
        workers (a server a simulator did not stop; a Ray worker's, re-parented here when Ray
        ended it: this process is a subreaper, probe/child_activity.py)."""
        self.session.stop()
        if self.session.torn_down:
            return
        close_envs(self.env)
        if self.evaluator is not None:
            close_evaluator(self.evaluator)
        self.close()
        end_descendants(set(self.spare))

    @abstractmethod
    def close(self) -> None:
        """Release what the backend holds beyond its workers (the Ray connection)."""


def close_envs(env: WorkerGroup) -> None:
    env.get(env.call_all(EnvWorker.close))


def close_evaluator(evaluator: WorkerGroup) -> None:
    evaluator.get(evaluator.call(0, EvalWorker.close))
