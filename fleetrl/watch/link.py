"""What a supervised controller and its supervisor tell each other, as JSON under fixed keys of
the supervisor's heartbeat store: plain data only crosses the process boundary.

    controller → supervisor   WORKERS   the workers to watch, [{component, rank, node}]
                              DEADLINE  a start-up step under a deadline ({what, started, seconds};
                                        null once it finished): the supervisor enforces it, and
                                        the controller's silence inside it (ray.init holds the GIL
                                        for seconds) is no freeze
                              STOPPING  watching ends: the controller is shutting its workers down
                              FAILURE   an incident the controller saw (a worker's error, a start-up
                                        step past its deadline), as `incident_fields`
                              ATTACHED  the report hooks (trackers) have run
    supervisor → controller   REPORT    the report is written (its folder): run the report hooks
                              STOPPING_SEEN  STOPPING is acted on
"""

from __future__ import annotations

import json

from fleetrl.watch.incident import Incident

# The controller's phases that wait on its workers (controller/loop.py, controller/updates.py,
# controller/async_updates.py): with workers of their own (Ray, fused), those are watched, and the
# wait is not judged by a deadline of its own.
CONTROLLER_WAITS = (
    "startup.backend",
    "startup.load_state",
    "weight_sync",
    "collect_and_train",
    "evaluation",
    "async.collect",
    "async.queue_full",
    "async.drain",
)
WORKERS = "fleetrl/link/workers"
DEADLINE = "fleetrl/link/deadline"
STOPPING = "fleetrl/link/stopping"
STOPPING_SEEN = "fleetrl/link/stopping-seen"
FAILURE = "fleetrl/link/failure"
REPORT = "fleetrl/link/report"
ATTACHED = "fleetrl/link/attached"


def put(store, key: str, value) -> None:
    """Put `value` under `key` of `store`, a `SealedStore` (probe/seal.py)."""
    store.set(key, json.dumps(value))


def peek(store, key: str):
    """The value under `key`, or None when nothing was put there yet, or nothing sealed by this
    run: a forged message is no message (never blocks)."""
    value = store.peek(key)
    return None if value is None else json.loads(value)


KEYS = ("culprit", "clock", "host")  # an incident's (component, rank) fields


def incident_fields(incident: Incident) -> dict:
    fields = {"cause": incident.cause, "summary": incident.summary, "started": incident.started}
    fields |= {name: list(key) if (key := getattr(incident, name)) else None for name in KEYS}
    return fields | {"detail": incident.detail, "last_words": incident.last_words}


def incident_from_fields(fields: dict) -> Incident:
    keys = {name: tuple(fields[name]) if fields.get(name) else None for name in KEYS}
    return Incident(
        fields["cause"],
        fields["summary"],
        fields["started"],
        detail=fields["detail"],
        last_words=fields.get("last_words"),
        **keys,
    )
