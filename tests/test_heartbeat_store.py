"""The controller's heartbeat store: workers publish through their store client (plain Python, on the
TCPStore wire protocol: probe/store_client.py) into a real TCPStore server; the
controller reads whoever has published, before and after every worker has. A worker whose own
records turn malformed is counted, and judged for that (watch/judging/rejected_records.py), not as frozen."""

from __future__ import annotations

import json
import logging
import queue
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace

from fleetrl.config.schema import WatchdogConfig
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.probe.seal import run_secret
from fleetrl.probe.store import HeartbeatStore, connect_publisher, parse_record
from fleetrl.watch.watchdog import Watchdog
from tests.support import REPO, subprocess_env


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


def test_a_run_delay_is_optional_and_when_present_a_number_or_null():
    """Records of workers older than the fields carry no run delay (no evidence of starvation,
    watch/judging/judgement.py); a present one that is not a number is rejected before it is judged."""
    worker = ("env", 0)
    for field in ("thread_run_delay_s", "subprocesses_run_delay_s"):
        for delay in ({}, {field: 1.5}, {field: 2}, {field: None}):
            record = {**beat(worker, "env.step", 1), **delay}
            assert parse_record(worker, json.dumps(record)) == (record, "")
        malformed = json.dumps({**beat(worker, "env.step", 1), field: "1.5"})
        assert parse_record(worker, malformed) == (None, f'its {field} is "1.5", not a number or null')


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


def test_a_wait_is_in_the_store_as_it_begins_and_its_end_at_the_beat_it_wakes():
    """The controller's wait on its workers' calls (cluster/groups.py `RayGroup.get`) is published
    from the waiting thread before it waits, not at the next beat (a minute away here): a worker may
    die a moment after. Its end wakes the heartbeat thread, which publishes it."""
    secret = run_secret()
    store = HeartbeatStore("127.0.0.1", secret)
    controller = ("controller", 0)
    recorder = Recorder(*controller, 0)
    recorder.start_publishing(connect_publisher("127.0.0.1", store.port, *controller, secret), 60.0)
    try:
        assert store.read([controller])[controller]["waiting_on"] == []
        sent = time.time() - 1.0
        recorder.wait_on((("actor", "actor.train", (0, 1), sent),))
        (call,) = store.read([controller])[controller]["waiting_on"]
        assert call["elapsed_s"] >= 1.0
        assert {**call, "elapsed_s": None} == {
            "component": "actor",
            "phase": "actor.train",
            "ranks": [0, 1],
            "elapsed_s": None,
        }
        recorder.wait_on(())
        deadline = time.monotonic() + 30
        while store.read([controller])[controller]["waiting_on"]:
            assert time.monotonic() < deadline, "the wait's end was not published"
            time.sleep(0.02)
    finally:
        recorder.stop()


MALFORMING_WORKER = """
import sys, time
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.probe.seal import run_secret
from fleetrl.probe.store import connect_publisher
recorder = Recorder("actor", 1, 0)
recorder.start_publishing(connect_publisher("127.0.0.1", int(sys.argv[1]), "actor", 1, run_secret()), 0.2)
with recorder.in_phase("actor.train"):
    time.sleep(float(sys.argv[2]))  # good records meanwhile
    record = recorder.record  # from here on, another fleetrl's format: its beat counter a string
    recorder.record = lambda: {**(good := record()), "beat": str(good["beat"])}
    print("malformed from now", flush=True)
    while True:
        time.sleep(0.02)
"""


def test_a_worker_whose_own_records_turn_malformed_is_named_for_it_not_frozen(caplog):
    """A real worker process publishes good records, then records sealed with the run's secret
    but malformed. Its last good record stands and ages; the rejected ones still arriving prove it
    publishes, so it is not `process_frozen` at the heartbeat timeout: an error says it cannot be
    watched, and only past busy_allowance_s is the run stopped, naming it and the reason. Once its
    records stop arriving too (SIGSTOP), it is frozen, with its rejected records in the report."""
    config = WatchdogConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0, busy_allowance_s=4.0)
    store, key = HeartbeatStore("127.0.0.1", run_secret()), ("actor", 1)
    incidents: queue.Queue = queue.Queue()
    worker = subprocess.Popen(
        [sys.executable, "-c", MALFORMING_WORKER, str(store.port), "1.0"],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    watchdog = Watchdog(config, store.read, [key], incidents.put)
    try:
        with caplog.at_level(logging.WARNING, logger="fleetrl"):
            assert worker.stdout.readline() == "malformed from now\n"
            good = store.read([key])[key]
            assert (good["phase"], good["pid"]) == ("actor.train", worker.pid), good
            watchdog.start()
            incident = incidents.get(timeout=60)
        assert (incident.cause, incident.culprit) == ("watchdog_error", key), incident.summary
        rejected = incident.records[key]["rejected"]
        assert re.fullmatch(r'its beat is "\d+", not an integer', rejected["reason"]), rejected
        assert rejected["records"] > 1, rejected  # they kept arriving
        assert incident.summary.startswith(
            f"actor rank 1 (pid {worker.pid}) cannot be watched: its heartbeat records are rejected: "
            f"{rejected['reason']} ({rejected['records']} since its last good one, over "
        ), incident.summary
        assert "they still arrive, so it was not judged frozen, but unwatched past watchdog.busy_allowance_s (4 s)" in (
            incident.summary
        )
        messages = [r.getMessage() for r in caplog.records]
        assert (
            sum(m.startswith("actor rank 1 cannot be watched: its heartbeat records are rejected: ") for m in messages)
            == 1
        )
        assert (
            sum(m.startswith("rejected a malformed heartbeat record of actor rank 1 (its beat is ") for m in messages)
            == 1
        )

        worker.send_signal(signal.SIGSTOP)  # its rejected records stop arriving too: frozen
        watchdog = Watchdog(replace(config, busy_allowance_s=600.0), store.read, [key], incidents.put)
        watchdog.start()
        incident = incidents.get(timeout=60)
        assert (incident.cause, incident.culprit) == ("process_frozen", key), incident.summary
        assert "the process is stopped (SIGSTOP or a debugger)" in incident.summary
        assert "; before it went silent, its heartbeat records are rejected: its beat is " in incident.summary
    finally:
        watchdog.stop()
        worker.kill()
        worker.wait(timeout=30)
        worker.stdout.close()
