"""The one way in: pick the plan's backend and start it.

Invariant: `start_backend` returns a backend whose workers are all built, watched and given their
lanes — or it leaves nothing running: a config error or Ctrl-C closes what was started (in
reverse), and a worker's error becomes an incident report (exit 4).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from fleetrl.cluster.backends.base import Backend
from fleetrl.cluster.backends.fused import FusedBackend
from fleetrl.cluster.backends.inline import InlineBackend
from fleetrl.cluster.backends.ray import RayBackend
from fleetrl.cluster.groups import NotAWorkerMethod
from fleetrl.errors import UserError
from fleetrl.plan.layout import lane_sizes
from fleetrl.plan.run_plan import RunPlan
from fleetrl.probe.child_activity import descendant_pids, end_descendants
from fleetrl.watch.respond import IncidentStop
from fleetrl.watch.session import WatchSession
from fleetrl.workers.rollout_worker import RolloutWorker

BACKENDS: dict[str, type[Backend]] = {"inline": InlineBackend, "ray": RayBackend, "fused": FusedBackend}


def start_backend(plan: RunPlan, run_dir: Path, session: WatchSession | None = None) -> Backend:
    """`session`: how the workers are watched (default: from this process, `WatchSession`)."""
    session = session or WatchSession(plan.config, run_dir)
    spare = descendant_pids()  # running before any worker: never ended as a simulator's
    with contextlib.ExitStack() as undo:
        undo.callback(end_descendants, spare)  # last, once the workers are closed
        try:
            backend = BACKENDS[plan.layout.backend].start(plan, session, undo)
            configure_lanes(backend, plan)
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
    backend.spare = spare
    return backend


def configure_lanes(backend: Backend, plan: RunPlan) -> None:
    """Give every rollout worker a trajectory buffer per lane it serves (layout.plan_lanes)."""
    rollout, spaces = backend.rollout, (backend.observation_space, backend.action_space)
    rollout.get(
        [
            rollout.call(rank, RolloutWorker.configure_lanes, sizes, plan.config.algorithm.num_steps, *spaces)
            for rank, sizes in enumerate(lane_sizes(plan.config, plan.placement))
        ]
    )
