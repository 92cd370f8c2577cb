"""The heartbeat store, owned by the supervisor (supervise/supervisor.py), or by the controller when
it watches itself in-process (a `Trainer` used as a library).

A `torch.distributed.TCPStore` server (its network thread needs no GIL) holds the heartbeats of
every worker in one place that survives whichever worker dies. It listens on one address only —
the one its workers reach it at (the supervisor's choice, supervise/store_address.py: loopback when the run is on one machine): a
TCPStore given a host binds every interface, so the listening socket is made here and handed to it
(`master_listen_fd`). Workers connect as clients with a short timeout, through a client in plain
Python (`store_client.py`): a worker process never imports torch for its heartbeats. Every value
is sealed with the run's secret (probe/seal.py); a record that is forged or malformed is dropped
and logged, and the worker's last good record stands. A worker's own records (sealed with the
secret) that turn malformed are counted: its last good record carries `rejected` — how many, why,
since when — for the watchdog, to which they are evidence the worker still publishes
(watch/judging/rejected_records.py).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from fleetrl.net import listening_socket
from fleetrl.probe.flight_recorder import heartbeat_key
from fleetrl.probe.seal import Seal, SealedStore
from fleetrl.probe.store_client import CONNECT_TIMEOUT, StoreClient

log = logging.getLogger("fleetrl")
NUMBER = (int, float)
NONE = type(None)
# The fields the watchdog computes with: name, types, what they must be
FIELDS = (
    ("pid", int, "an integer"),
    ("beat", int, "an integer"),
    ("time", NUMBER, "a number"),
    ("phase", (str, NONE), "a string or null"),
    ("phase_started", (*NUMBER, NONE), "a number or null"),
    # optional (absent in older workers' records: no evidence of starvation, watch/judging/judgement.py)
    ("thread_run_delay_s", (*NUMBER, NONE), "a number or null"),
    ("subprocesses_run_delay_s", (*NUMBER, NONE), "a number or null"),
    ("subprocesses_ready", (int, NONE), "an integer or null"),
)


@dataclass
class Rejected:
    """A worker's own records rejected since its last good one (times: this process's monotonic clock)."""

    records: int
    reason: str  # why the newest was
    first: float
    last: float

    def fields(self, now: float) -> dict:
        return {"records": self.records, "reason": self.reason, "for_s": now - self.first, "last_s": now - self.last}


class HeartbeatStore:
    """Controller side: hosts the store and reads the workers' latest records."""

    def __init__(self, host: str, secret: bytes):
        """Listen on `host` only."""
        from torch.distributed import TCPStore  # here: a worker imports this module, torch-free

        self.host = host
        listener = listening_socket(host)
        port = listener.getsockname()[1]
        self.server = TCPStore(  # it owns the socket from here on
            host,
            port,
            is_master=True,
            wait_for_workers=False,
            timeout=CONNECT_TIMEOUT,
            master_listen_fd=listener.detach(),
        )
        self.port = self.server.port
        self.sealed = SealedStore(self.server, Seal(secret))
        self.last_good: dict[tuple[str, int], dict] = {}
        self.last_value: dict[tuple[str, int], str] = {}  # the value read last, good or not
        self.rejected: dict[tuple[str, int], Rejected] = {}  # since each worker's last good record
        self.malformed: set[tuple[str, int]] = set()  # workers a malformed record was seen of (logged once)

    def read(self, workers: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
        """The latest good record of each (component, rank) that has published one. Once all
        have, two store round trips per poll (check + multi_get) instead of two per worker. A
        record is decoded only when its value changed: the watchdog polls twice per beat, and
        decoding every record on every poll was most of its CPU at 1,024 workers
        (docs/benchmarks/scale.md); an unchanged record is the same dict, whose annotations
        the watchdog rewrites on each poll. A record that stands while the worker's newer ones are
        rejected is returned as a copy with `rejected` added (`Rejected.fields`, as of this poll)."""
        values = self.sealed.peek_all([heartbeat_key(component, rank) for component, rank in workers])
        now = time.monotonic()
        for worker, value in zip(workers, values):
            if value is None or value == self.last_value.get(worker):
                continue  # none sealed by the run, or unchanged since the last poll: decoded once
            self.last_value[worker] = value
            record, reason = parse_record(worker, value)
            if record is not None:
                self.last_good[worker] = record
                self.rejected.pop(worker, None)
                continue
            if worker in self.rejected:
                rejected = self.rejected[worker]
                rejected.records, rejected.reason, rejected.last = rejected.records + 1, reason, now
            else:
                self.rejected[worker] = Rejected(1, reason, now, now)
            if worker not in self.malformed:
                self.malformed.add(worker)
                log.warning("rejected a malformed heartbeat record of %s rank %d (%s): %.200s", *worker, reason, value)
        records = {worker: self.last_good[worker] for worker in workers if worker in self.last_good}
        for worker, rejected in self.rejected.items():
            if worker in records:
                records[worker] = {**records[worker], "rejected": rejected.fields(now)}
        return records

    def publisher(self, component: str, rank: int):
        """A publish function for a recorder living in this (the controller's) process."""
        key = heartbeat_key(component, rank)
        return lambda payload: self.sealed.set(key, payload)


def parse_record(worker: tuple[str, int], value: str) -> tuple[dict | None, str]:
    """(the record in `value`, "") if it is a heartbeat of `worker` — its identity, the fields
    the watchdog computes with, of their types; else (None, why not)."""
    try:
        record = json.loads(value)
    except ValueError as error:
        return None, f"not JSON ({error})"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    said = (record.get("component"), record.get("rank"))
    if said != worker:
        return None, f"it is filed under {worker[0]} rank {worker[1]} but names {said[0]} rank {said[1]}"
    for name, types, wanted in FIELDS:
        if not isinstance(record.get(name), types):
            return None, f"its {name} is {json.dumps(record.get(name))[:40]}, not {wanted}"
    return record, ""


def connect_publisher(host: str, port: int, component: str, rank: int, secret: bytes):
    """Worker side: a publish function writing this worker's heartbeat into the controller's store."""
    store = SealedStore(StoreClient(host, port, CONNECT_TIMEOUT), Seal(secret))
    key = heartbeat_key(component, rank)
    return lambda payload: store.set(key, payload)
