"""The watchdog's verdict on one poll's heartbeat records: the incident they show, or None.

In order of precedence: a worker that never published a heartbeat within `startup_allowance_s`
of the start of watching (`startup_timeout`); a worker process that is gone (`worker_died`); a
worker that stopped beating (`process_frozen`: SIGSTOP, or the GIL held by a C call that never
returns; `node_lost` when its whole node no longer runs Ray, watch/judging/node_loss.py; one whose threads
wait for a CPU is starved, not frozen, until `busy_allowance_s`: watch/judging/starved_process.py); actor ranks
waiting in a collective that another rank entered differently (`collective_mismatch`) or never
entered (`rank_missing_from_collective`) — the ranks lined up by collective sequence number, so
the rank that is behind is named and not the ones waiting for it (watch/judging/alignment.py; the
process-group join is such a collective, waited in for the start-up step allowance); a phase
over its deadline (`phase_timeout`), never blamed on a rank that waits for a peer behind it, and
named as the collective miss when a peer waits for it in a collective. A worker whose own records
the store has rejected is not judged frozen while they arrive; past `busy_allowance_s` it is a
`watchdog_error` naming it (watch/judging/rejected_records.py).

Heartbeat and phase ages are the watcher's own (`observe`, watch/judging/judgement.py): a worker's clock
is never compared with this one. Deadlines are learned: a phase may take `deadline_factor` × the
longest time it has taken before, clamped to [min_deadline_s, max_deadline_s]. A phase never seen
finishing gets `startup_step_allowance_s` if it is a start-up step (`STARTUP_STEPS`: its stall is
a `startup_timeout`), otherwise `first_call_bound_s`. Past its deadline a call is judged from its
recent beats: *blocked* (no CPU, a stack that does not move) or *spinning* (a wait that polls:
CPU at a stack that does not move, and the thread found in a wait sample after sample) is an
incident at once; *busy* (computing, with system calls or not) is one "slow" warning in the log,
and an incident only past `busy_allowance_s`. Start-up steps and first calls are judged alike.

The busy allowance counts the time a call could run: its age less the time its thread waited,
runnable, for a CPU over the call (its run delay, or where that lags, the samples that found it
ready to run: `Seen.cpu_wait_s`). Why: a healthy update on a host loaded past its cores once got
3-11 % of a core, took 722 s, and was stopped at 600 s as if it computed forever; a computation
that never ends is still stopped once it has had the allowance's worth of turns (a late report,
not a false kill).
"""

from __future__ import annotations

import logging
import os
import socket
import time

import psutil

from fleetrl.config.schema import WatchdogConfig
from fleetrl.watch.incident import Incident, died
from fleetrl.watch.judging import alignment, last_words, rejected_records
from fleetrl.watch.judging.judgement import BUSY, Judgement, Seen
from fleetrl.watch.judging.node_loss import node_lost
from fleetrl.watch.judging.starved_process import STARVED_SHARE, SilentWorkers
from fleetrl.watch.naming import describe, doing, where

log = logging.getLogger("fleetrl")

# Methods that are steps of a worker's start-up (the `construct` phase is the worker host's):
# never seen finishing, they get `startup_step_allowance_s`, and a stall in one is `startup_timeout`.
# The controller's own start-up phases (`startup.backend`, `startup.resume`, ...: controller/loop.py) too.
STARTUP_STEPS = ("construct", "spaces", "reset", "init_distributed", "join_weight_sync", "build_learner")


def startup_step(phase: str) -> bool:
    return phase.startswith("startup.") or phase.rsplit(".", 1)[-1] in STARTUP_STEPS


def has_ended(pid: int) -> bool:
    """The process has exited, reaped or not — unless it is this process's own child, whose exit
    the parent's wait reads, with its status (the supervisor's controller: a zombie between a
    normal exit and its reaping is not a death). A killed Ray worker stays a zombie until its
    parent, the raylet, reaps it, while its peers see their connections reset at once: on a
    loaded host a survivor's "Connection reset by peer" once reached the controller while the
    dead rank was still a zombie, and the survivor was named the culprit."""
    try:
        process = psutil.Process(pid)
        return process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) and process.ppid() != os.getpid()
    except psutil.NoSuchProcess:
        return True


class Checks:
    """The checks over `workers`, and what they keep between polls: each worker's beats as seen
    on this clock, and the calls already warned about as slow. `fleetrl top` uses them alone, to
    show ages and deadlines as the watchdog sees them."""

    config: WatchdogConfig
    workers: list[tuple[str, int]]
    started: float  # when watching began (epoch seconds): the start-up allowance counts from it
    hostname: str  # a worker on this machine can be looked at as a process
    seen: dict[tuple[str, int], Seen]
    warned_slow: set  # (worker, phase, its start): one "slow" warning per call
    warned_unwatched: set  # workers whose records are rejected: one error each
    silent: SilentWorkers  # the run delays of this machine's silent workers (watch/judging/starved_process.py)
    warned_starved: set  # silent workers found starved of CPU: one warning each
    observed_at: float | None  # the last observation (monotonic): a longer gap is the watcher's own absence

    def __init__(self, config: WatchdogConfig, workers: list[tuple[str, int]]):
        self.config, self.workers = config, workers
        self.started = time.time()
        self.hostname = socket.gethostname()
        self.seen = {}
        self.warned_slow = set()
        self.warned_unwatched = set()
        self.silent = SilentWorkers()
        self.warned_starved = set()
        self.observed_at = None

    def observe(self, records: dict) -> dict:
        """Note each record's beat on this process's clock; annotate `records` with the ages
        measured on it (`heartbeat_age_s`, `phase_age_s`; `silence_s`, the heartbeat age less the
        watcher's own absences) and with the offset of its clock from the worker's
        (`clock_offset_s`: judgement.on_watcher_clock)."""
        now = time.monotonic()
        self.discount_own_absence(now)
        for key, record in records.items():
            seen = self.seen.setdefault(key, Seen())
            seen.update(record, now)
            record["heartbeat_age_s"], record["phase_age_s"] = seen.heartbeat_age(now), seen.phase_age(record, now)
            record["silence_s"] = seen.silence(now)
            record["clock_offset_s"] = seen.clock_offset
        self.silent.observe(
            {r["pid"] for r in records.values() if r.get("host") == self.hostname and self.silent_now(r)}
        )
        return records

    def discount_own_absence(self, now: float) -> None:
        """Time the watcher itself did not run is no evidence against a worker. Between two
        observations more than half the heartbeat timeout apart, the watcher's own process was
        stopped (SIGSTOP, Ctrl-Z then `fg`, a debugger: the store it hosts stopped with it, so the
        workers' beats could not land) or starved of CPU: a worker's silence is judged by the time
        the watcher was there to see it (`silence_s`; a stopped `fleetrl train`, resumed, once
        stopped its healthy run as frozen). Its last beat stays when it was (`heartbeat_age_s`):
        a report's times are true ones."""
        if self.observed_at is not None and now - self.observed_at > self.config.heartbeat_timeout_s / 2:
            for seen in self.seen.values():
                seen.watcher_absent_s += now - self.observed_at - self.config.poll_interval_s
        self.observed_at = now

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
            if record.get("host") == self.hostname and has_ended(record["pid"]):
                words = last_words.from_record(record)
                return died(
                    key, record, words, f"it was {doing(key, record, records)}", now - record["heartbeat_age_s"]
                )
        return None

    def check_beating(self, records: dict, now: float) -> Incident | None:
        for key, record in records.items():
            age = record["heartbeat_age_s"]
            if record.get("silence_s", age) <= self.config.heartbeat_timeout_s:
                continue
            if rejected_records.arriving(
                record, self.config.heartbeat_timeout_s
            ):  # alive but unreadable: watch/judging/rejected_records.py
                summary = rejected_records.past_allowance(
                    key, record, self.config.busy_allowance_s, self.warned_unwatched
                )
                if summary is not None:
                    return Incident("watchdog_error", summary, now - rejected_records.unwatched_s(record), key)
                continue
            lost = node_lost(records, key, now)
            if lost is not None:
                culprit, summary = lost
                return Incident("node_lost", summary, now - age, culprit)
            key, record, stopped = self.stopped_among_silent(records, key, record)
            age, starved = record["heartbeat_age_s"], None if stopped else self.starved(record)
            if starved and record.get("silence_s", age) <= self.config.busy_allowance_s:
                self.warn_starved(key, record, starved)
                continue
            state = self.process_state(record, stopped, starved)
            return Incident(
                "process_frozen",
                f"{describe(key)} (pid {record['pid']}) stopped publishing "
                f"heartbeats {age:.1f} s ago: {state}; last seen {where(record)}{rejected_records.note(record)}",
                now - age,
                key,
            )
        return None

    def silent_now(self, record: dict) -> bool:
        """The worker has missed two heartbeats: silent, not merely between beats."""
        return record.get("silence_s", record["heartbeat_age_s"]) > 2 * self.config.heartbeat_interval_s

    def stopped_among_silent(
        self, records: dict, key: tuple[str, int], record: dict
    ) -> tuple[tuple[str, int], dict, bool]:
        """The worker to name for `key`'s silence, its record, and whether its process is stopped:
        `key`, unless another worker that has also stopped beating is a stopped process. Workers
        waiting on a stopped one can go silent with it (Ray's global garbage collection in every
        worker, threads starved on a loaded host), some a little before it: the stopped process
        is the fault, not the first silent one. Each process's state is read once (a system call)."""
        if self.stopped(record):
            return key, record, True
        for other, candidate in records.items():
            if other != key and self.silent_now(candidate) and self.stopped(candidate):
                return other, candidate, True
        return key, record, False

    def stopped(self, record: dict) -> bool:
        """The worker's process is on this machine and stopped (SIGSTOP, a debugger)."""
        try:
            return (
                record.get("host") == self.hostname and psutil.Process(record["pid"]).status() == psutil.STATUS_STOPPED
            )
        except psutil.Error:
            return False

    def starved(self, record: dict) -> tuple[float, float] | None:
        """(share, seconds) where the silent worker's process (not a stopped one: the caller
        knows) is on this machine and one of its threads waited for a CPU at least STARVED_SHARE
        of the time since it fell silent."""
        if record.get("host") != self.hostname:
            return None
        found = self.silent.starved_share(record["pid"])
        return found if found is not None and found[0] >= STARVED_SHARE else None

    def warn_starved(self, key: tuple[str, int], record: dict, starved: tuple[float, float]) -> None:
        if key in self.warned_starved:
            return
        self.warned_starved.add(key)
        log.warning(
            "%s (pid %s) has published no heartbeat for %.1f s: %s; not judged frozen until it has been silent "
            "for watchdog.busy_allowance_s (%g s)",
            describe(key),
            record["pid"],
            record["heartbeat_age_s"],
            starved_text(starved),
            self.config.busy_allowance_s,
        )

    def process_state(self, record: dict, stopped: bool, starved: tuple[float, float] | None = None) -> str:
        if record.get("host") != self.hostname:
            return "it is on another machine (no local process check)"
        if stopped:
            return "the process is stopped (SIGSTOP or a debugger)"
        if has_ended(record["pid"]):
            return "the process is gone"
        if starved:
            return f"the process is alive but starved of CPU: {starved_text(starved)}"
        return "the process is alive but its Python threads do not run (the GIL is held by a C call)"

    def check_collectives(self, records: dict, now: float) -> Incident | None:
        """Actor ranks aligned by collective sequence number: the rank holding up a collective
        waited in for longer than collective_timeout_s, the join for longer than
        startup_step_allowance_s (watch/judging/alignment.py)."""
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
            if not phase or record["phase_age_s"] is None:  # no age without the worker's elapsed time in it
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
            cpu_wait_s = min(self.seen[key].cpu_wait_s(), age) if not judgement.stalled else 0.0
            if not judgement.stalled and age - cpu_wait_s <= max(limit, self.config.busy_allowance_s):
                self.warn_slow(key, record, limit, judgement)
                continue
            held_up = alignment.held_up_by(records, key, now)
            if held_up is not None:  # its peers wait for it: the collective miss, named as check_collectives would
                return Incident(held_up.cause, held_up.summary, now - age, key, state=judgement.state)
            return self.overdue(key, record, limit, judgement, now, cpu_wait_s)
        return None

    def overdue(
        self, key: tuple[str, int], record: dict, limit: float, judgement: Judgement, now: float, cpu_wait_s: float
    ) -> Incident:
        """The incident of a call past its deadline: blocked or spinning, or busy for longer than
        `busy_allowance_s` besides the `cpu_wait_s` seconds its thread waited for a CPU."""
        phase, age = record["phase"], record["phase_age_s"]
        longest = record.get("phase_max_s", {}).get(phase)
        before = f"longest before {longest:.3f} s" if longest else "never finished before"
        allowance = ""
        if judgement.state == BUSY:
            waited = f" besides {cpu_wait_s:.1f} s its thread waited for a CPU" if cpu_wait_s >= 0.05 else ""
            allowance = f"; past watchdog.busy_allowance_s ({self.config.busy_allowance_s:g} s){waited}"
        cause = "startup_timeout" if startup_step(phase) and not longest else "phase_timeout"
        return Incident(
            cause,
            f"{describe(key)} has been in {phase} for {age:.1f} s (deadline {limit:.1f} s; {before}) "
            f"and is {judgement.text()}{allowance}",
            now - age,
            key,
            state=judgement.state,
            waits_on=[
                {"pid": pid, "command": command, "state": state, "cpu": share}
                for pid, command, state, share in judgement.waited_on
            ],
            cpu_wait_s=cpu_wait_s,
        )

    def warn_slow(self, key: tuple[str, int], record: dict, limit: float, judgement: Judgement) -> None:
        call = (key, record["phase"], record["phase_started"])
        if call in self.warned_slow:
            return
        self.warned_slow.add(call)
        log.warning(
            "slow: %s has been in %s for %s, past its deadline of %s, but is %s; "
            "an incident only past watchdog.busy_allowance_s (%g s), not counting its thread's waits for a CPU",
            describe(key),
            record["phase"],
            seconds_text(record["phase_age_s"]),
            seconds_text(limit),
            judgement.text(),
            self.config.busy_allowance_s,
        )


def seconds_text(seconds: float) -> str:
    """'16 s', or '0.4 s' below 10 s (a sub-second deadline read '0 s')."""
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def starved_text(starved: tuple[float, float]) -> str:
    share, span = starved
    return f"a thread of it waited for a CPU {share:.0%} of the last {span:.1f} s (the host's other load)"
