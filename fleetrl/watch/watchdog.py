"""The controller's watchdog: reads every worker's heartbeat and names what went wrong.

It runs as a thread of the controller, polling the heartbeat store. In order of precedence it
raises an `Incident` for: a worker process that is gone (`worker_died`); a worker that stopped
beating (`process_frozen`: SIGSTOP, or the GIL held by a C call that never returns; `node_lost`
when its whole node no longer runs Ray, watch/node_loss.py); actor ranks
waiting in a collective that another rank entered differently (`collective_mismatch`) or never
entered (`rank_missing_from_collective`) — the ranks lined up by collective sequence number, so
the rank that is behind is named and not the ones waiting for it (watch/alignment.py; the
process-group join is such a collective, waited in for the start-up step allowance); a phase
over its deadline (`phase_timeout`), never blamed on a rank that waits for a peer behind it, and
named as the collective miss when a peer waits for it in a collective. An
exception in the watchdog's own poll (a record it cannot read, a store that fails) is an incident
too (`watchdog_error`): a watchdog that died quietly would leave the run going on unwatched; so is
a worker whose own records the store has rejected for `busy_allowance_s` (watch/rejected.py), which
is not judged frozen while they arrive.

An incident's `started` is the fault's first sign — the culprit's last progress (its last
heartbeat, the start of the phase or collective it overran) — so that `detected_after_s` measures
the watchdog, not the moment it looked. Heartbeat and phase ages are the watcher's own
(watch/judgement.py): a worker's clock is never compared with this one.

Deadlines are learned: a phase may take `deadline_factor` × the longest time it has taken before,
clamped to [min_deadline_s, max_deadline_s]. A phase never seen finishing gets
`startup_step_allowance_s` if it is a start-up step (`STARTUP_STEPS`: its stall is a
`startup_timeout`), otherwise `first_call_bound_s`. Past its deadline a call is judged from its
recent beats: *blocked* (no CPU, a stack that does not move) or *spinning* (a wait that polls:
CPU at a stack that does not move, and the thread found in a wait sample after sample) is an
incident at once; *busy* (computing, with system calls or not) is one "slow" warning in the log,
and an incident only past `busy_allowance_s`. Start-up steps and first calls are judged alike. A worker that never
published a heartbeat gets `startup_allowance_s` from the start of watching.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

import psutil

from fleetrl.config.schema import WatchdogConfig
from fleetrl.probe.flight_recorder import join_unless_current
from fleetrl.watch import alignment, last_words, rejected
from fleetrl.watch.judgement import BUSY, Judgement, Seen
from fleetrl.watch.naming import collective_text, describe, where  # noqa: F401 (the report's names too)
from fleetrl.watch.node_loss import node_lost

log = logging.getLogger("fleetrl")

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
    state: str | None = None  # a stalled call's judgement: "blocked", "spinning" or "busy"
    # The watched process (component, rank) whose clock `started` is on, until the watcher has
    # moved it onto its own (a worker's exception classified where its heartbeats are not seen)
    clock: tuple[str, int] | None = None
    # The watched process the culprit runs in, where that is another name (an inline worker's
    # exception names `env rank 0`, which runs in `inline rank 0`): the report lists the culprit
    # as a worker of its own, with that process's pid, phase and stack
    host: tuple[str, int] | None = None
    # A dead worker's last words (watch/last_words.py LastWords.as_dict): how it ended, its node,
    # the tail of its own stderr
    last_words: dict | None = None


# Methods that are steps of a worker's start-up (the `construct` phase is the worker host's):
# never seen finishing, they get `startup_step_allowance_s`, and a stall in one is `startup_timeout`.
# The controller's own start-up phases (`startup.backend`, `startup.resume`, ...: runner.py) too.
STARTUP_STEPS = ("construct", "spaces", "reset", "init_distributed", "build_learner")


def startup_step(phase: str) -> bool:
    return phase.startswith("startup.") or phase.rsplit(".", 1)[-1] in STARTUP_STEPS


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


def died(key: tuple[str, int], record: dict, words, doing: str, started: float) -> Incident:
    """`worker_died` for `key` with its last words (a `LastWords`, or None where they could not be
    read) — or, where its stderr says Gloo or NCCL aborted it on a collective mismatch, that
    mismatch (`collective_mismatch`), naming it as the rank whose collectives diverged."""
    pid = f"pid {record['pid']}, " if record.get("pid") else ""
    node = words.node if words else f"node {record.get('node')}"
    ended = words.ended if words else "its process is gone"
    fields = {"last_words": words.as_dict() if words else None, "detail": words.stderr_tail if words else ""}
    mismatch = words.mismatch if words else None
    if mismatch:
        return Incident(
            "collective_mismatch",
            f"{describe(key)} ({pid}{node}) was aborted by a collective mismatch: its collectives diverged "
            f'from its peers\' ({ended}; its stderr: "{mismatch}"); {doing}',
            started,
            key,
            **fields,
        )
    return Incident("worker_died", f"{describe(key)} ({pid}{node}) died: {ended}; {doing}", started, key, **fields)


class Watchdog(threading.Thread):
    def __init__(self, config: WatchdogConfig, read_records, workers: list[tuple[str, int]], on_incident):
        super().__init__(name="fleetrl-watchdog", daemon=True)
        self.config, self.read_records, self.workers = config, read_records, workers
        self.on_incident = on_incident
        self.started = time.time()
        self.hostname = socket.gethostname()
        self.incident: Incident | None = None
        self.stopping = threading.Event()
        self.records: dict = {}
        self.seen: dict[tuple[str, int], Seen] = {}
        self.warned_slow: set = set()  # (worker, phase, its start): one "slow" warning per call
        self.warned_unwatched: set = set()  # workers whose records are rejected: one error each
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
        self.records = self.observe(self.read_records(self.workers))
        now = time.time()
        self.timeline.append((now, {f"{k[0]}/{k[1]}": r.get("phase") for k, r in self.records.items()}))
        incident = self.inspect(self.records, now)
        if incident is not None:
            incident.records = self.records
        return incident

    def observe(self, records: dict) -> dict:
        """Note each record's beat on this process's clock; annotate `records` with the ages
        measured on it (`heartbeat_age_s`, `phase_age_s`) and with the offset of its clock from
        the worker's (`clock_offset_s`: judgement.on_watcher_clock)."""
        now = time.monotonic()
        for key, record in records.items():
            seen = self.seen.setdefault(key, Seen())
            seen.update(record, now)
            record["heartbeat_age_s"], record["phase_age_s"] = seen.heartbeat_age(now), seen.phase_age(record, now)
            record["clock_offset_s"] = seen.clock_offset
        return records

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
                words = last_words.from_record(record)
                return died(key, record, words, f"it was {where(record)}", now - record["heartbeat_age_s"])
        return None

    def check_beating(self, records: dict, now: float) -> Incident | None:
        for key, record in records.items():
            age = record["heartbeat_age_s"]
            if age <= self.config.heartbeat_timeout_s:
                continue
            if rejected.arriving(record, self.config.heartbeat_timeout_s):  # alive but unreadable: watch/rejected.py
                summary = rejected.past_allowance(key, record, self.config.busy_allowance_s, self.warned_unwatched)
                if summary is not None:
                    return Incident("watchdog_error", summary, now - rejected.unwatched_s(record), key)
                continue
            lost = node_lost(records, key, now)
            if lost is not None:
                culprit, summary = lost
                return Incident("node_lost", summary, now - age, culprit)
            key, record = self.stopped_among_silent(records, key, record)
            age, state = record["heartbeat_age_s"], self.process_state(record)
            return Incident(
                "process_frozen",
                f"{describe(key)} (pid {record['pid']}) stopped publishing "
                f"heartbeats {age:.1f} s ago: {state}; last seen {where(record)}{rejected.note(record)}",
                now - age,
                key,
            )
        return None

    def stopped_among_silent(self, records: dict, key: tuple[str, int], record: dict) -> tuple[tuple[str, int], dict]:
        """The worker to name for `key`'s silence: `key`, unless another worker that has also
        stopped beating is a stopped process. Workers waiting on a stopped one can go silent with
        it (Ray's global garbage collection in every worker, threads starved on a loaded host),
        some a little before it: the stopped process is the fault, not the first silent one."""
        if self.stopped(record):
            return key, record
        silent = 2 * self.config.heartbeat_interval_s
        for other, candidate in records.items():
            if candidate["heartbeat_age_s"] > silent and self.stopped(candidate):
                return other, candidate
        return key, record

    def stopped(self, record: dict) -> bool:
        """The worker's process is on this machine and stopped (SIGSTOP, a debugger)."""
        try:
            return (
                record.get("host") == self.hostname and psutil.Process(record["pid"]).status() == psutil.STATUS_STOPPED
            )
        except psutil.Error:
            return False

    def process_state(self, record: dict) -> str:
        if record.get("host") != self.hostname:
            return "it is on another machine (no local process check)"
        if self.stopped(record):
            return "the process is stopped (SIGSTOP or a debugger)"
        if not psutil.pid_exists(record["pid"]):
            return "the process is gone"
        return "the process is alive but its Python threads do not run (the GIL is held by a C call)"

    def check_collectives(self, records: dict, now: float) -> Incident | None:
        """Actor ranks aligned by collective sequence number: the rank holding up a collective
        waited in for longer than collective_timeout_s, the join for longer than
        startup_step_allowance_s (watch/alignment.py)."""
        config = self.config
        finding = alignment.diagnose(records, now, config.collective_timeout_s, config.startup_step_allowance_s)
        if finding is None:
            return None
        return Incident(finding.cause, finding.summary, finding.started, finding.culprit)

    def deadline(self, record: dict, phase: str) -> float:
        seen = record.get("phase_max_s", {}).get(phase)
        if seen:
            return min(max(self.config.deadline_factor * seen, self.config.min_deadline_s), self.config.max_deadline_s)
        return self.config.startup_step_allowance_s if startup_step(phase) else self.config.first_call_bound_s

    def patience_s(self, collective: dict) -> float:
        """How long a rank may wait in `collective`: the join gets the start-up step allowance."""
        return alignment.patience_s(collective, self.config.collective_timeout_s, self.config.startup_step_allowance_s)

    def check_deadlines(self, records: dict, now: float) -> Incident | None:
        for key, record in records.items():
            phase = record.get("phase")
            if not phase:
                continue
            collective = alignment.oldest_in_flight(record)
            if collective and (
                alignment.waited_s(record, collective, now) <= self.patience_s(collective)
                or alignment.behind_peers(records, key)
            ):
                continue  # waiting for peers: check_collectives names the one behind
            age, limit = record["phase_age_s"], self.deadline(record, phase)
            if age <= limit:
                continue
            window_s = max(2.0, 4 * self.config.heartbeat_interval_s)
            judgement = self.seen[key].judge(time.monotonic(), window_s)
            if judgement is None:
                continue  # too few fresh beats to tell yet; beats that stopped are check_beating's
            if not judgement.stalled and age <= max(limit, self.config.busy_allowance_s):
                self.warn_slow(key, record, limit, judgement)
                continue
            held_up = alignment.held_up_by(records, key, now)
            if held_up is not None:  # its peers wait for it: the collective miss, named as check_collectives would
                return Incident(held_up.cause, held_up.summary, now - age, key, state=judgement.state)
            return self.overdue(key, record, limit, judgement, now)
        return None

    def overdue(self, key: tuple[str, int], record: dict, limit: float, judgement: Judgement, now: float) -> Incident:
        phase, age = record["phase"], record["phase_age_s"]
        longest = record.get("phase_max_s", {}).get(phase)
        before = f"longest before {longest:.3f} s" if longest else "never finished before"
        allowance = (
            f"; past watchdog.busy_allowance_s ({self.config.busy_allowance_s:g} s)" if judgement.state == BUSY else ""
        )
        cause = "startup_timeout" if startup_step(phase) and not longest else "phase_timeout"
        return Incident(
            cause,
            f"{describe(key)} has been in {phase} for {age:.1f} s (deadline {limit:.1f} s; {before}) "
            f"and is {judgement.text()}{allowance}",
            now - age,
            key,
            state=judgement.state,
        )

    def warn_slow(self, key: tuple[str, int], record: dict, limit: float, judgement: Judgement) -> None:
        call = (key, record["phase"], record["phase_started"])
        if call in self.warned_slow:
            return
        self.warned_slow.add(call)
        log.warning(
            "slow: %s has been in %s for %.0f s, past its deadline of %.0f s, but is %s; "
            "an incident only past watchdog.busy_allowance_s (%g s)",
            describe(key),
            record["phase"],
            record["phase_age_s"],
            limit,
            judgement.text(),
            self.config.busy_allowance_s,
        )
