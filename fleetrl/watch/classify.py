"""An exception that reached the controller → the incident it stands for."""

from __future__ import annotations

import re
import time
import traceback

from fleetrl.dist.process_group import JoinError
from fleetrl.watch.watchdog import Incident, describe


def incident_from_error(error: BaseException, records: dict, actor_ranks: dict) -> Incident:
    """`records`: (component, rank) → heartbeat record; `actor_ranks`: Ray actor id (hex) →
    (component, rank). Ray wraps a worker's exception in RayTaskError (with the worker's pid and
    the original as `.cause`) and a dead worker in RayActorError (with its actor id)."""
    now = time.time()
    try:
        from ray.exceptions import RayActorError, RayTaskError
    except ImportError:  # the inline backend without Ray installed
        RayActorError = RayTaskError = ()
    if isinstance(error, RayActorError):
        key = actor_ranks.get(getattr(error, "actor_id", None))
        who = describe(key) if key else "a worker"
        return Incident("worker_died", f"{who} died (Ray lost its process): {str(error).splitlines()[0]}",
                        now, key, str(error))
    if isinstance(error, RayTaskError):
        match = re.search(r"pid=(\d+)", str(error))  # the raising worker's pid, in Ray's header
        pid = int(match.group(1)) if match else None
        key = next((k for k, r in records.items() if r.get("pid") == pid), None)
        cause = getattr(error, "cause", None) or error
        return classified(cause, key, records, now, str(error))
    key = next((k for k, r in records.items() if r.get("phase")), None)  # inline: the one busy
    return classified(error, key, records, now, "".join(traceback.format_exception(error)))


def classified(cause: BaseException, key, records: dict, now: float, detail: str) -> Incident:
    who = describe(key) if key else "a worker"
    phase = records.get(key, {}).get("phase") if key else None
    if isinstance(cause, JoinError):
        return Incident("peer_unreachable", f"{who} could not reach its peers: {cause}", now, key, detail)
    if isinstance(cause, OSError) and cause.errno == 28:  # ENOSPC
        return Incident("disk_full", f"{who} ran out of disk space{f' in {phase}' if phase else ''}: {cause}",
                        now, key, detail)
    return Incident("worker_exception", f"{who} raised {type(cause).__name__}"
                    f"{f' in {phase}' if phase else ''}: {cause}", now, key, detail)
