"""The controller's watchdog: reads every worker's heartbeat and names what went wrong.

It runs as a thread of the controller, polling the heartbeat store. In order of precedence it
raises an `Incident` for: a worker process that is gone (`worker_died`); a worker that stopped
beating (`process_frozen`: SIGSTOP, or the GIL held by a C call that never returns; `node_lost`
when its whole node no longer runs Ray, watch/node_loss.py); actor ranks
waiting in a collective that another rank entered differently (`collective_mismatch`) or never
entered (`rank_missing_from_collective`); a phase over its deadline (`phase_timeout`). An
exception in the watchdog's own poll (a record it cannot read, a store that fails) is an incident
too (`watchdog_error`): a watchdog that died quietly would leave the run going on unwatched.

An incident's `started` is the fault's first sign — the culprit's last progress (its last
heartbeat, the start of the phase or collective it overran) — so that `detected_after_s` measures
the watchdog, not the moment it looked.

Deadlines are learned: a phase may take `deadline_factor` × the longest time it has taken before,
clamped to [min_deadline_s, max_deadline_s]; a phase never seen finishing (start-up, the first
step of a slow simulator) gets `startup_allowance_s`.
"""

from __future__ import annotations

import socket
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

import psutil

from fleetrl.config.schema import WatchdogConfig
from fleetrl.watch.flight_recorder import join_unless_current
from fleetrl.watch.node_loss import node_lost_summary
from fleetrl.watch.received_clock import ReceivedClock

CAUSES = (
    "worker_died",
    "worker_exception",
    "collective_mismatch",
    "rank_missing_from_collective",
    "phase_timeout",
    "process_frozen",
    "node_lost",
    "peer_unreachable",
    "disk_full",
    "interrupted",
    "startup_timeout",
    "watchdog_error",
)


@dataclass
class Incident:
    cause: str
    summary: str
    started: float  # when the fault began (epoch seconds), as well as it can be told
    culprit: tuple[str, int] | None = None  # (component, rank)
    detail: str = ""  # e.g. the worker's traceback
    records: dict = field(default_factory=dict)  # (component, rank) → last heartbeat record
    timeline: list = field(default_factory=list)  # (time, {"component/rank": phase}) before it


# Components whose ranks form the actor process group: actor workers, or fused ranks
# (cluster/fused.py) that host an actor rank with its env and rollout.
PROCESS_GROUP_MEMBERS = ("actor", "fused")


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


def describe(key: tuple[str, int]) -> str:
    return f"{key[0]} rank {key[1]}"


def where(record: dict, now: float) -> str:
    phase = record.get("phase")
    if not phase:
        return "idle between calls"
    return f"in {phase} for {now - record['phase_started']:.1f} s"


def collective_text(collective: dict) -> str:
    return f"{collective['op']} #{collective['seq']} ({collective['call_site']}, shapes {collective['shapes']})"


class Watchdog(threading.Thread):
    def __init__(self, config: WatchdogConfig, read_records, workers: list[tuple[str, int]], on_incident):
        super().__init__(name="fleetrl-watchdog", daemon=True)
        self.config, self.read_records, self.workers = config, read_records, workers
        self.on_incident = on_incident
        self.started = time.time()
        self.hostname = socket.gethostname()
        self.incident: Incident | None = None
        self.stopping = threading.Event()
        self.records: dict = {}  # the last poll's, their times on this clock (received_clock.py)
        self.clock = ReceivedClock()
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
                self.incident = incident
                self.on_incident(incident)
                return

    def poll(self) -> Incident | None:
        now = time.time()
        self.records = self.clock.received(self.read_records(self.workers), now)
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
        return self.clock.received(records, time.time()), unreadable

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

    def inspect(self, records: dict, now: float) -> Incident | None:
        for check in (
            self.check_started,
            self.check_alive,
            self.check_beating,
            self.check_collectives,
            self.check_deadlines,
        ):
            incident = check(records, now)
            if incident is not None:
                return incident
        return None

    def check_started(self, records: dict, now: float) -> Incident | None:
        if now - self.started < self.config.startup_allowance_s:
            return None
        missing = [key for key in self.workers if key not in records]
        if missing:
            return Incident(
                "startup_timeout",
                f"{describe(missing[0])} never started: no heartbeat "
                f"{now - self.started:.0f} s after launch (watchdog.startup_allowance_s)",
                self.started,
                missing[0],
            )
        return None

    def check_alive(self, records: dict, now: float) -> Incident | None:
        for key, record in records.items():
            if record.get("host") == self.hostname and not psutil.pid_exists(record["pid"]):
                return Incident(
                    "worker_died",
                    f"{describe(key)} (pid {record['pid']}, node {record['node']}) "
                    f"died: its process is gone; it was {where(record, record['time'])}",
                    record["time"],
                    key,
                )
        return None

    def check_beating(self, records: dict, now: float) -> Incident | None:
        for key, record in records.items():
            age = now - record["time"]
            if age <= self.config.heartbeat_timeout_s:
                continue
            lost = node_lost_summary(records, key, now)
            if lost is not None:
                return Incident("node_lost", lost, record["time"], key)
            state = self.process_state(record)
            return Incident(
                "process_frozen",
                f"{describe(key)} (pid {record['pid']}) stopped publishing "
                f"heartbeats {age:.1f} s ago: {state}; last seen {where(record, record['time'])}",
                record["time"],
                key,
            )
        return None

    def process_state(self, record: dict) -> str:
        if record.get("host") != self.hostname:
            return "it is on another machine (no local process check)"
        try:
            if psutil.Process(record["pid"]).status() == psutil.STATUS_STOPPED:
                return "the process is stopped (SIGSTOP or a debugger)"
        except psutil.Error:
            return "the process is gone"
        return "the process is alive but its Python threads do not run (the GIL is held by a C call)"

    def check_collectives(self, records: dict, now: float) -> Incident | None:
        actors = {key: r for key, r in records.items() if key[0] in PROCESS_GROUP_MEMBERS}
        stalled = {
            key: r["collective"]
            for key, r in actors.items()
            if r.get("collective") and now - r["collective"]["started"] > self.config.collective_timeout_s
        }
        if not stalled:
            return None
        (first_key, first), *_ = sorted(stalled.items())
        for key, record in sorted(actors.items()):
            theirs = record.get("collective")
            if theirs is None:
                last = record.get("last_collective")
                last_seq = last["seq"] if last else 0
                others = ", ".join(describe(k) for k in stalled)
                if not record.get("phase"):  # it finished its call: the waiting rank did extra
                    return Incident(
                        "collective_mismatch",
                        f"{describe(first_key)} waits in {collective_text(first)}, which no other rank "
                        f"will enter: {describe(key)} finished its call after collective #{last_seq}. "
                        f"{describe(first_key)} made more collectives (or optimisation steps) than the others",
                        first["started"],
                        first_key,
                    )
                return Incident(
                    "rank_missing_from_collective",
                    f"{describe(key)} never entered {collective_text(first)}; it is {where(record, now)}; "
                    f"{others} wait in #{first['seq']}",
                    first["started"],
                    key,
                )
            if (theirs["seq"], theirs["op"], theirs["shapes"]) != (first["seq"], first["op"], first["shapes"]):
                return Incident(
                    "collective_mismatch",
                    f"actor ranks disagree on the next collective: {describe(first_key)} is in "
                    f"{collective_text(first)}, {describe(key)} in {collective_text(theirs)}",
                    max(first["started"], theirs["started"]),
                    key if key != first_key else first_key,
                )
        return None

    def deadline(self, record: dict, phase: str) -> float:
        seen = record.get("phase_max_s", {}).get(phase)
        if not seen:
            return self.config.startup_allowance_s
        return min(max(self.config.deadline_factor * seen, self.config.min_deadline_s), self.config.max_deadline_s)

    def check_deadlines(self, records: dict, now: float) -> Incident | None:
        for key, record in records.items():
            phase = record.get("phase")
            if not phase:
                continue
            collective = record.get("collective")
            if collective and now - collective["started"] <= self.config.collective_timeout_s:
                continue  # waiting for peers: check_collectives names a missing one first
            age, limit = now - record["phase_started"], self.deadline(record, phase)
            if age > limit:
                longest = record.get("phase_max_s", {}).get(phase)
                before = f"longest before {longest:.3f} s" if longest else "never finished before"
                return Incident(
                    "phase_timeout",
                    f"{describe(key)} has been in {phase} for {age:.1f} s (deadline {limit:.1f} s; {before})",
                    record["phase_started"],
                    key,
                )
        return None
