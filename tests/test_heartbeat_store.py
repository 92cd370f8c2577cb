"""The controller's heartbeat store: workers publish through their store client (plain Python, on the
TCPStore wire protocol: probe/store_client.py) into a real TCPStore server; the
controller reads whoever has published, before and after every worker has."""

from __future__ import annotations

import json

from fleetrl.probe.seal import run_secret
from fleetrl.probe.store import HeartbeatStore, connect_publisher


def beat(worker: tuple[str, int], phase: str, n: int) -> dict:
    """A heartbeat record of `worker` with the fields the store checks."""
    return {
        "component": worker[0],
        "rank": worker[1],
        "pid": 1,
        "beat": n,
        "time": 0.0,
        "phase": phase,
        "phase_started": None,
    }


def test_read_returns_the_latest_record_of_each_worker_that_published():
    secret = run_secret()
    store = HeartbeatStore("127.0.0.1", secret)
    workers = [("env", 0), ("rollout", 0), ("actor", 0), ("actor", 1)]
    publish = {worker: connect_publisher("127.0.0.1", store.port, *worker, secret) for worker in workers}
    assert store.read(workers) == {}
    publish[("actor", 1)](json.dumps(beat(("actor", 1), "actor.train", 1)))
    assert store.read(workers) == {("actor", 1): beat(("actor", 1), "actor.train", 1)}
    for n, worker in enumerate(workers):
        publish[worker](json.dumps(beat(worker, f"{worker[0]}.call", n + 10)))
    records = store.read(workers)
    assert list(records) == workers
    assert [r["beat"] for r in records.values()] == [10, 11, 12, 13]
    assert store.read([]) == {}
