"""What the runner sees of where the workers run: three worker groups, a collector, one flag.

Every backend (cluster/inline.py, cluster/ray_backend.py, cluster/fused.py) presents the same
`Backend`: the env, rollout and actor groups (called with the worker classes' methods), the
`collector` that runs one collect-then-train iteration, `shares_policy` (the rollout workers act
with the actor's own policy object: no weight sync), `fail(error)` and `shutdown()`. The runner
never asks which backend it has.

`start_backend` is the one way in. Invariant: it returns a backend whose workers are all built,
watched and given their lanes — or it leaves nothing running: a config error or Ctrl-C closes
what was started (in reverse), and a worker's error becomes an incident report (exit 4).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import NoReturn

import gymnasium as gym

from fleetrl.cluster.groups import NotAWorkerMethod, WorkerGroup
from fleetrl.cluster.layout import Layout, lane_sizes
from fleetrl.collect import Iterations
from fleetrl.config.schema import Config
from fleetrl.errors import UserError
from fleetrl.watch.respond import IncidentStop
from fleetrl.watch.session import WatchSession
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker


class Backend(ABC):
    shares_policy: bool = False  # rollout acts with the actor's own policy object (one process)

    def __init__(
        self,
        session: WatchSession,
        env: WorkerGroup,
        rollout: WorkerGroup,
        actor: WorkerGroup,
        spaces: tuple[gym.Space, gym.Space],
        collector: Iterations,
    ):
        self.session: WatchSession = session
        self.env: WorkerGroup = env
        self.rollout: WorkerGroup = rollout
        self.actor: WorkerGroup = actor
        self.observation_space, self.action_space = spaces
        self.collector: Iterations = collector

    @classmethod
    @abstractmethod
    def start(cls, config: Config, layout: Layout, session: WatchSession, undo: contextlib.ExitStack) -> Backend:
        """Build and watch the workers; push onto `undo` how to close each thing started."""

    def fail(self, error: BaseException) -> NoReturn:
        """A worker's error reached the controller: report it as an incident, tear down, raise
        IncidentStop."""
        self.session.fail(error)

    def shutdown(self) -> None:
        """Stop the threads that use the heartbeat store, close the simulators (they may own
        subprocesses), then whatever the backend itself holds — unless an incident already
        ended every worker."""
        self.session.stop()
        if self.session.torn_down:
            return
        close_envs(self.env)
        self.close()

    @abstractmethod
    def close(self) -> None:
        """Release what the backend holds beyond its workers (the Ray connection)."""


def close_envs(env: WorkerGroup) -> None:
    env.get(env.call_all(EnvWorker.close))


def backend_class(layout: Layout) -> type[Backend]:
    if layout.backend == "inline":
        from fleetrl.cluster.inline import InlineBackend

        return InlineBackend
    if layout.backend == "fused":
        from fleetrl.cluster.fused import FusedBackend

        return FusedBackend
    from fleetrl.cluster.ray_backend import RayBackend

    return RayBackend


def start_backend(config: Config, layout: Layout, run_dir: Path) -> Backend:
    session = WatchSession(config, run_dir)
    with contextlib.ExitStack() as undo:
        try:
            backend = backend_class(layout).start(config, layout, session, undo)
            configure_lanes(backend, config, layout)
        except (UserError, KeyboardInterrupt, NotAWorkerMethod):
            session.stop()
            raise  # and `undo` closes what was started
        except IncidentStop:
            undo.pop_all()  # the incident response ended everything
            raise
        except Exception as error:
            undo.pop_all()
            session.fail(error)
        undo.pop_all()
    return backend


def configure_lanes(backend: Backend, config: Config, layout: Layout) -> None:
    """Give every rollout worker a trajectory buffer per lane it serves (layout.plan_lanes)."""
    rollout, spaces = backend.rollout, (backend.observation_space, backend.action_space)
    rollout.get(
        [
            rollout.call(rank, RolloutWorker.configure_lanes, sizes, config.algorithm.num_steps, *spaces)
            for rank, sizes in enumerate(lane_sizes(config, layout.placement))
        ]
    )
