"""The heartbeat store, owned by the supervisor (supervise/supervisor.py), or by the controller when
it watches itself in-process (a `Trainer` used as a library).

A `torch.distributed.TCPStore` server (its network thread needs no GIL; it listens on every
interface) holds the heartbeats of every worker in one place that survives whichever worker dies.
Workers connect as clients with a short timeout, through a client in plain Python
(`store_client.py`): a worker process never imports torch for its heartbeats.
"""

from __future__ import annotations

import json

from fleetrl.probe.flight_recorder import heartbeat_key
from fleetrl.probe.store_client import CONNECT_TIMEOUT, StoreClient


class HeartbeatStore:
    """Controller side: hosts the store and reads the workers' latest records."""

    def __init__(self, host: str):
        from torch.distributed import TCPStore  # here: a worker imports this module, torch-free

        self.host = host
        self.server = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=CONNECT_TIMEOUT)
        self.port = self.server.port

    def read(self, workers: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
        """The latest record of each (component, rank) that has published one. Once all have,
        two store round trips per poll (check + multi_get) instead of two per worker."""
        keys = [heartbeat_key(component, rank) for component, rank in workers]
        if keys and self.server.check(keys):
            return {worker: json.loads(payload) for worker, payload in zip(workers, self.server.multi_get(keys))}
        return {
            worker: json.loads(self.server.get(key)) for worker, key in zip(workers, keys) if self.server.check([key])
        }

    def publisher(self, component: str, rank: int):
        """A publish function for a recorder living in this (the controller's) process."""
        key = heartbeat_key(component, rank)
        return lambda payload: self.server.set(key, payload)


def connect_publisher(host: str, port: int, component: str, rank: int):
    """Worker side: a publish function writing this worker's heartbeat into the controller's store."""
    client = StoreClient(host, port, CONNECT_TIMEOUT)
    key = heartbeat_key(component, rank)
    return lambda payload: client.set(key, payload)
