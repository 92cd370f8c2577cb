"""The watchdog's loop (fleetrl/watch/watchdog.py) over a real heartbeat store, in process: it polls
every `poll_interval_s`, keeps a timeline of who was in which phase over the last minute, raises
the first incident its checks find — once, with the timeline and the records — and stops when told,
and never keeps its process alive (a daemon thread); a poll that raises is itself an incident
(`watchdog_error`) naming the error, with every record that can still be read and the ones that
cannot named in its detail, one line each. What a record must hold to be read at all (`readable`)
is checked field by field. Exact and fast: the mutation run's tests for the loop."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import time

import pytest

from fleetrl.config.schema import WatchdogConfig
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.probe.seal import run_secret
from fleetrl.probe.store import HeartbeatStore, connect_publisher
from fleetrl.watch.reporting.hang_report import build_hang_report, render_text
from fleetrl.watch.watchdog import Watchdog, absent_s, readable
from tests.support import subprocess_env

CONFIG = WatchdogConfig(poll_interval_s=0.05, heartbeat_timeout_s=1.0)
ENV, ACTOR = ("env", 0), ("actor", 0)


def record(worker, phase: str = "env.step", beat: int = 1, **fields) -> dict:
    """A real recorder's record for `worker` on this machine (this live process's pid)."""
    recorder = Recorder(*worker, 0)
    recorder.enter_phase(phase)
    return {**recorder.record(), "pid": os.getpid(), "host": socket.gethostname(), "beat": beat, **fields}


@pytest.fixture
def store():
    secret = run_secret()
    store = HeartbeatStore("127.0.0.1", secret)
    publishers = {w: connect_publisher("127.0.0.1", store.port, *w, secret) for w in (ENV, ACTOR)}
    yield store, lambda worker, rec: publishers[worker](json.dumps(rec))


def watch(read, workers=(ENV, ACTOR)) -> tuple[Watchdog, queue.Queue]:
    incidents: queue.Queue = queue.Queue()
    watchdog = Watchdog(CONFIG, read, list(workers), incidents.put)
    watchdog.start()
    return watchdog, incidents


def actor_beats_until_the_incident(watchdog: Watchdog, incidents: queue.Queue, publish, beat: int):
    """The actor goes on beating (from `beat`, every 0.1 s) until the watchdog's incident, at most
    30 s; then the watchdog is stopped and its incident returned."""
    started = time.monotonic()
    try:
        while incidents.empty() and time.monotonic() - started < 30:
            publish(ACTOR, record(ACTOR, "actor.train", beat=beat))
            beat += 1
            time.sleep(0.1)
        return incidents.get(timeout=1)
    finally:
        watchdog.stop()


def test_a_worker_that_stops_beating_is_the_loop_s_one_incident_with_the_timeline(store):
    heartbeats, publish = store
    for beat in range(1, 4):  # both beat, then the env stops
        publish(ENV, record(ENV, beat=beat))
        publish(ACTOR, record(ACTOR, "actor.train", beat=beat))
        time.sleep(0.1)
    watchdog, incidents = watch(heartbeats.read)
    incident = actor_beats_until_the_incident(watchdog, incidents, publish, 4)
    assert (incident.cause, incident.culprit) == ("process_frozen", ENV), incident.summary
    assert incident.records[ENV]["heartbeat_age_s"] > CONFIG.heartbeat_timeout_s
    assert watchdog.incident is incident and incidents.empty() and not watchdog.is_alive()  # one, then it ends
    assert incident.timeline and incident.timeline[-1][1] == {"env/0": "env.step", "actor/0": "actor.train"}
    assert len(watchdog.timeline) <= int(60 / CONFIG.poll_interval_s)


def test_a_watchdog_that_did_not_run_for_a_while_says_how_long_in_its_incident_and_report(store):
    """Its thread got no turn for 2 s while the env was frozen (here: one poll that takes 2 s):
    that much of the detection is the watchdog's absence, not its verdict's lateness."""
    heartbeats, publish = store
    publish(ENV, record(ENV))
    publish(ACTOR, record(ACTOR, "actor.train"))
    polls = []

    def read(keys):
        polls.append(time.time())
        if len(polls) == 4:  # the env's last beat is older than this: the absence counts
            time.sleep(2.0)
        return heartbeats.read(keys)

    incident = actor_beats_until_the_incident(*watch(read), publish, 2)
    assert (incident.cause, incident.culprit) == ("process_frozen", ENV), incident.summary
    last_poll = incident.timeline[-1][0]
    assert 2.0 - CONFIG.poll_interval_s <= incident.watcher_absent_s <= last_poll - incident.started
    report = build_hang_report(incident, [{"component": "env", "rank": 0}], {}, last_poll)
    assert report["watcher_absent_s"] == incident.watcher_absent_s
    assert f"; the watchdog itself did not run for {incident.watcher_absent_s:.1f} s of it" in render_text(report)


def test_the_timeline_keeps_the_last_minute_of_polls_and_lets_the_oldest_go(store):
    """A poll every 0.5 s: the last 120 polls, what the report shows of the minute before the incident."""
    heartbeats, publish = store
    publish(ENV, record(ENV))
    watchdog = Watchdog(WatchdogConfig(poll_interval_s=0.5, heartbeat_timeout_s=5.0), heartbeats.read, [ENV], print)
    for _ in range(3):
        watchdog.poll()
    fourth = time.time()
    for _ in range(120):
        watchdog.poll()
    assert len(watchdog.timeline) == 120 and watchdog.timeline[0][0] >= fourth
    assert watchdog.timeline[-1][1] == {"env/0": "env.step"}


def test_a_process_that_ends_without_stopping_its_watchdog_exits_all_the_same():
    """The watchdog's thread is a daemon: a program whose main thread ends (or raises) before it
    stops its watchdog exits, instead of polling on unwatched for ever."""
    assert Watchdog(CONFIG, lambda keys: {}, [ENV], print).daemon
    program = (
        "import time\n"
        "from fleetrl.config.schema import WatchdogConfig\n"
        "from fleetrl.watch.watchdog import Watchdog\n"
        "watchdog = Watchdog(WatchdogConfig(poll_interval_s=0.05), lambda keys: {}, [], print)\n"
        "watchdog.start()\n"
        "while len(watchdog.timeline) < 2 and watchdog.is_alive():\n"
        "    time.sleep(0.05)\n"
        "print('polling' if watchdog.is_alive() else 'stopped')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], env=subprocess_env(), capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, "polling\n"), done.stderr[-3000:]


@pytest.mark.parametrize(
    ("since", "absent"),
    [
        (0.3, 2.75),  # the 3 s gap less one interval
        (2.0, 1.75),  # a gap that began before the incident: its part after it
        (4.0, 0.0),  # a gap before the incident
    ],
)
def test_the_absence_is_each_gap_between_polls_past_twice_the_interval_less_one_interval(since, absent):
    polls = [0.0, 0.25, 0.75, 3.75, 4.0, 4.5]  # gaps 0.25, 0.5 (= twice: not counted), 3.0, 0.25, 0.5
    assert absent_s(polls, since, 0.25) == pytest.approx(absent)


def test_each_gap_past_twice_the_interval_adds_its_absence_even_one_short_of_three_intervals():
    polls = [0.0, 0.6, 0.85, 1.85]  # gaps 0.6 (2.4 intervals), 0.25, 1.0
    assert absent_s(polls, 0.0, 0.25) == pytest.approx(0.35 + 0.75)


def test_a_poll_that_raises_is_a_watchdog_error_naming_it_with_what_can_still_be_read(store):
    heartbeats, publish = store
    publish(ENV, record(ENV))
    publish(ACTOR, record(ACTOR, "actor.train", phase_max_s=["not", "a", "dict"]))  # accepted, then judged

    def read(keys):
        records = heartbeats.read(keys)
        if keys == [ACTOR]:  # read alone, the actor's record cannot even be read
            raise ConnectionError("the store went away")
        return records

    watchdog, incidents = watch(read)
    try:
        incident = incidents.get(timeout=30)
    finally:
        watchdog.stop()
    assert incident.cause == "watchdog_error" and incident.culprit is None
    assert incident.summary.startswith(
        "the watchdog (thread fleetrl-watchdog of the controller) raised AttributeError: 'list' object has no attribute"
    ), incident.summary
    assert incident.summary.endswith("; the run can no longer be watched, so it is stopped")
    assert (
        incident.detail.startswith("Traceback (most recent call last):\n  File ")
        and "check_deadlines" in incident.detail
    )
    assert incident.detail.endswith("\nheartbeat record unreadable: actor rank 0: ConnectionError: the store went away")
    assert list(incident.records) == [ENV] and incident.records[ENV]["heartbeat_age_s"] >= 0
    assert abs(incident.started - time.time()) < 30


def test_each_record_that_cannot_be_read_has_a_line_of_its_own_in_a_watchdog_error():
    failures = {ENV: ConnectionError("connection reset"), ACTOR: TimeoutError("no answer in 5 s")}

    def read(keys):
        raise failures[keys[0]]

    incident = Watchdog(CONFIG, read, [ENV, ACTOR], print).failed(KeyError("phase"))
    assert incident.summary.startswith("the watchdog (thread fleetrl-watchdog of the controller) raised KeyError: ")
    assert incident.detail.endswith(
        "\nheartbeat record unreadable: env rank 0: ConnectionError: connection reset"
        "\nheartbeat record unreadable: actor rank 0: TimeoutError: no answer in 5 s"
    ), incident.detail
    assert incident.records == {}


def test_a_stopped_watchdog_polls_no_more_and_stop_waits_for_the_poll_under_way(store):
    heartbeats, publish = store
    polls = []

    def read(keys):
        polls.append(time.monotonic())
        time.sleep(0.2)  # a slow store
        return heartbeats.read(keys)

    watchdog, incidents = watch(read)
    time.sleep(0.5)
    watchdog.stop()
    assert not watchdog.is_alive() and incidents.empty() and watchdog.incident is None
    count = len(polls)
    time.sleep(0.3)
    assert len(polls) == count >= 1


@pytest.mark.parametrize(
    ("change", "readable_too"),
    [
        ({}, True),
        ({"pid": "12"}, False),
        ({"pid": 1.5}, False),
        ({"time": "now"}, False),
        ({"time": 3}, True),
        ({"phase_started": None}, True),
        ({"phase_started": 2}, True),
        ({"phase_started": "2"}, False),
    ],
)
def test_a_record_is_read_only_with_an_integer_pid_a_numeric_time_and_a_phase_start_or_none(change, readable_too):
    checked = {**record(ENV), **change}
    if readable_too:
        assert readable(checked) is checked
    else:
        with pytest.raises(TypeError, match=r"^not a heartbeat record: \{"):
            readable(checked)


def test_what_is_not_a_record_is_quoted_in_the_error_up_to_200_characters():
    with pytest.raises(TypeError, match=r"^not a heartbeat record: \['a list'\]$"):
        readable(["a list"])
    long = {**record(ENV), "pid": None, "padding": "x" * 500}
    with pytest.raises(TypeError) as caught:
        readable(long)
    assert len(str(caught.value)) == len("not a heartbeat record: ") + 200
