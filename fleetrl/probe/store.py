"""The heartbeat store, owned by the supervisor (supervise/supervisor.py), or by the controller when
it watches itself in-process (a `Trainer` used as a library).

A `torch.distributed.TCPStore` server (its network thread needs no GIL) holds the heartbeats of
every worker in one place that survives whichever worker dies. It listens on one address only —
the one its workers reach it at (the supervisor's choice, supervise/store_address.py: loopback when the run is on one machine): a
TCPStore given a host binds every interface, so the listening socket is made here and handed to it
(`master_listen_fd`). Workers connect as clients with a short timeout, through a client in plain
Python (`store_client.py`): a worker process never imports torch for its heartbeats. Every value
is sealed with the run's secret (probe/seal.py); a record that is forged or malformed is dropped
and logged, and the worker's last good record stands.
"""

from __future__ import annotations

import json
import logging

from fleetrl.net import listening_socket
from fleetrl.probe.flight_recorder import heartbeat_key
from fleetrl.probe.seal import Seal, SealedStore
from fleetrl.probe.store_client import CONNECT_TIMEOUT, StoreClient

log = logging.getLogger("fleetrl")
NUMBER = (int, float)


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
        self.last_value: dict[tuple[str, int], str] = {}  # the value last_good was read from
        self.malformed: set[tuple[str, int]] = set()  # workers a malformed record was seen of (logged once)

    def read(self, workers: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
        """The latest good record of each (component, rank) that has published one. Once all
        have, two store round trips per poll (check + multi_get) instead of two per worker. A
        record is decoded only when its value changed: the watchdog polls twice per beat, and
        decoding every record on every poll was most of its CPU at 1,024 workers
        (docs/benchmarks/scale.md); an unchanged record is the same dict, whose annotations
        the watchdog rewrites on each poll."""
        values = self.sealed.peek_all([heartbeat_key(component, rank) for component, rank in workers])
        for worker, value in zip(workers, values):
            if value is not None and value == self.last_value.get(worker):
                continue  # unchanged since the last poll: decoded once (see below)
            record = well_formed(worker, value) if value is not None else None
            if record is not None:
                self.last_good[worker], self.last_value[worker] = record, value
            elif value is not None and worker not in self.malformed:
                self.malformed.add(worker)
                log.warning("rejected a malformed heartbeat record of %s rank %d: %.200s", *worker, value)
        return {worker: self.last_good[worker] for worker in workers if worker in self.last_good}

    def publisher(self, component: str, rank: int):
        """A publish function for a recorder living in this (the controller's) process."""
        key = heartbeat_key(component, rank)
        return lambda payload: self.sealed.set(key, payload)


def well_formed(worker: tuple[str, int], value: str) -> dict | None:
    """The record in `value` if it is a heartbeat of `worker` (its identity, the fields the
    watchdog computes with, of their types); None if not."""
    try:
        record = json.loads(value)
        valid = (
            isinstance(record, dict)
            and (record.get("component"), record.get("rank")) == worker
            and isinstance(record.get("pid"), int)
            and isinstance(record.get("beat"), int)
            and isinstance(record.get("time"), NUMBER)
            and isinstance(record.get("phase"), (str, type(None)))
            and isinstance(record.get("phase_started"), (*NUMBER, type(None)))
        )
    except ValueError:
        return None
    return record if valid else None


def connect_publisher(host: str, port: int, component: str, rank: int, secret: bytes):
    """Worker side: a publish function writing this worker's heartbeat into the controller's store."""
    store = SealedStore(StoreClient(host, port, CONNECT_TIMEOUT), Seal(secret))
    key = heartbeat_key(component, rank)
    return lambda payload: store.set(key, payload)
