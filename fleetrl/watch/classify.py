"""An exception that reached the controller → the incident it stands for.

The incident starts at the fault's first sign, not when the controller classifies it: a worker's
exception when it was raised (`WorkerError.raised_at`), a dead Ray worker at its last heartbeat."""

from __future__ import annotations

import time
import traceback

from fleetrl.watch.host import WorkerError
from fleetrl.watch.watchdog import Incident, describe


def incident_from_error(error: BaseException, records: dict, actor_ranks: dict) -> Incident:
    """`records`: (component, rank) → heartbeat record; `actor_ranks`: Ray actor id (hex) →
    (component, rank). A worker's exception arrives as a `WorkerError` naming its raiser (on Ray
    inside a RayTaskError, possibly after travelling as another call's argument); a dead Ray
    worker as a RayActorError carrying its actor id."""
    now = time.time()
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # the inline backend without Ray installed
        RayActorError = ()
    if isinstance(error, RayActorError):
        key = actor_ranks.get(getattr(error, "actor_id", None))
        who = describe(key) if key else "a worker"
        last_beat = records.get(key, {}).get("time", now)
        return Incident(
            "worker_died",
            f"{who} died (Ray lost its process): {str(error).splitlines()[0]}",
            last_beat,
            key,
            str(error),
        )
    raised = worker_error(error)
    if raised is None:  # raised in the controller itself
        return Incident(
            "worker_exception",
            f"the controller raised {type(error).__name__}: {error}",
            now,
            None,
            "".join(traceback.format_exception(error)),
        )
    key = (raised.component, raised.rank)
    message = raised.message.strip().splitlines()[0] if raised.message.strip() else ""
    said = f"{describe(key)} raised {raised.error_type} in {raised.phase}: {message}"
    if raised.error_type == "JoinError":
        return Incident(
            "peer_unreachable",
            f"{describe(key)} could not reach its peers: {message}",
            raised.raised_at,
            key,
            raised.trace,
        )
    if "No space left on device" in raised.message:
        return Incident("disk_full", said, raised.raised_at, key, raised.trace)
    return Incident("worker_exception", said, raised.raised_at, key, raised.trace)


def worker_error(error: BaseException) -> WorkerError | None:
    """The WorkerError inside `error` (Ray's wrapper keeps it as `.cause`), if any."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, WorkerError):
            return error
        error = getattr(error, "cause", None) or error.__cause__
        seen += 1
    return None
