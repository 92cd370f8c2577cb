"""The controller's heartbeat store: workers publish through their store client (plain Python, on the
TCPStore wire protocol: probe/store_client.py) into a real TCPStore server; the
controller reads whoever has published, before and after every worker has."""

from __future__ import annotations

import json

from fleetrl.probe.store import HeartbeatStore, connect_publisher


def test_read_returns_the_latest_record_of_each_worker_that_published():
    store = HeartbeatStore("127.0.0.1")
    workers = [("env", 0), ("rollout", 0), ("actor", 0), ("actor", 1)]
    publish = {worker: connect_publisher("127.0.0.1", store.port, *worker) for worker in workers}
    assert store.read(workers) == {}
    publish[("actor", 1)](json.dumps({"phase": "actor.train", "n": 1}))
    assert store.read(workers) == {("actor", 1): {"phase": "actor.train", "n": 1}}
    for n, worker in enumerate(workers):
        publish[worker](json.dumps({"phase": f"{worker[0]}.call", "n": n + 10}))
    records = store.read(workers)
    assert list(records) == workers
    assert [r["n"] for r in records.values()] == [10, 11, 12, 13]
    assert store.read([]) == {}
