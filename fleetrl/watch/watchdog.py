"""The watchdog: a thread that polls every worker's heartbeat and raises the first incident the
records show (watch/judging/verdict.py judges them; watch/incident.py says what an incident is).

It runs in the supervisor (and in a `Trainer` that watches itself), polling the heartbeat store
every `poll_interval_s`; the incident goes to `on_incident`, with the last minute's timeline of
phases. An exception in its own poll (a record it cannot read, a store that fails) is an incident
too (`watchdog_error`): a watchdog that died quietly would leave the run going on unwatched.

A watchdog that does not run cannot detect: on a host loaded past its cores its thread may wait
seconds for a turn, and a stopped process waits as long as it is stopped. Each incident says how
much of the time since the fault began that was (`Incident.watcher_absent_s`, from the times of
its polls), so that a late detection is told apart from a slow verdict.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque

from fleetrl.config.schema import WatchdogConfig
from fleetrl.probe.flight_recorder import join_unless_current
from fleetrl.watch.incident import Incident
from fleetrl.watch.judging.verdict import Checks
from fleetrl.watch.naming import describe


def readable(record) -> dict:
    """`record` if it has the shape the watchdog and the report rely on; else TypeError."""
    number = (int, float)
    if not (
        isinstance(record, dict)
        and isinstance(record.get("pid"), int)
        and isinstance(record.get("time"), number)
        and isinstance(record.get("phase_started"), (*number, type(None)))
    ):
        raise TypeError(f"not a heartbeat record: {str(record)[:200]}")
    return record


def absent_s(polls: list[float], since: float, interval_s: float) -> float:
    """Seconds after `since` in which a watchdog polling every `interval_s`, at the times `polls`
    (in order; the last is the poll that found the incident), did not run: of each gap between two
    polls longer than twice the interval, what lies past one interval (a shorter lateness is the
    poll's own work and the host's ordinary jitter)."""
    absent = 0.0
    for before, after in zip(polls, polls[1:]):
        if after - before > 2 * interval_s:
            absent += max(0.0, after - max(before + interval_s, since))
    return absent


class Watchdog(Checks, threading.Thread):
    def __init__(self, config: WatchdogConfig, read_records, workers: list[tuple[str, int]], on_incident):
        threading.Thread.__init__(self, name="fleetrl-watchdog", daemon=True)
        Checks.__init__(self, config, workers)
        self.read_records, self.on_incident = read_records, on_incident
        self.incident: Incident | None = None
        self.stopping = threading.Event()
        self.records: dict = {}
        # (time, {"component/rank": phase or None}) for the last minute: the report's timeline
        self.timeline: deque = deque(maxlen=int(60 / config.poll_interval_s))

    def run(self) -> None:
        while not self.stopping.wait(self.config.poll_interval_s):
            try:
                incident = self.poll()
            except Exception as error:  # any failure of the poll would leave the run unwatched
                incident = self.failed(error)
            if incident is not None:
                incident.timeline = list(self.timeline)
                polls = [moment for moment, _ in incident.timeline]
                incident.watcher_absent_s = absent_s(polls, incident.started, self.config.poll_interval_s)
                self.incident = incident
                self.on_incident(incident)
                return

    def poll(self) -> Incident | None:
        self.records = self.observe(self.read_records(self.workers))
        now = time.time()
        self.timeline.append((now, {f"{k[0]}/{k[1]}": r.get("phase") for k, r in self.records.items()}))
        incident = self.inspect(self.records, now)
        if incident is not None:
            incident.records = self.records
        return incident

    def readable_records(self) -> tuple[dict, list[str]]:
        """Every worker's record that can be read and understood, one by one, and a line naming
        each that cannot."""
        records, unreadable = {}, []
        for key in self.workers:
            try:
                record = self.read_records([key]).get(key)
                if record is not None:
                    records[key] = readable(record)
            except Exception as reason:  # report what can be read, name the rest
                unreadable.append(f"{describe(key)}: {type(reason).__name__}: {reason}")
        return self.observe(records), unreadable

    def failed(self, error: Exception) -> Incident:
        """The `watchdog_error` incident for an exception in the poll, with every worker's record
        that can still be read and understood; the others are named in its detail."""
        raised = time.time()
        records, unreadable = self.readable_records()
        trace = "".join(traceback.format_exception(error))
        return Incident(
            "watchdog_error",
            f"the watchdog (thread {self.name} of the controller) raised {type(error).__name__}: {error}; "
            "the run can no longer be watched, so it is stopped",
            raised,
            None,
            trace + "".join(f"\nheartbeat record unreadable: {line}" for line in unreadable),
            records,
        )

    def stop(self) -> None:
        """Stop polling; from another thread, also wait for the poll in progress to end."""
        self.stopping.set()
        join_unless_current(self)
