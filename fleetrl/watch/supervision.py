"""The supervisor's watch over one controller process: its `Watcher` (watch/watcher.py) around a
process it started but did not write (supervise/attempt.py starts it; this module watches it).

The controller is watched from its first instant; the workers it publishes (watch/link.py
WORKERS) from then on, until it says it is shutting them down (STOPPING). An incident is the
first of: the controller's own death (its exit status, reaped by the supervisor), an incident the
controller sent (FAILURE: a worker's error, a start-up step past its deadline), a start-up step it
declared (DEADLINE) and could not report itself, the controller stopped before its first
heartbeat, or what the watchdog saw. A dead worker — or a whole node lost — that the controller
saw as the others' errors is named as the cause.

This module is all of `fleetrl.watch` the supervisor imports (an import-linter contract says so):
`Incident` is the word for what ends an attempt, `keep_report` keeps one that restarts, and
`record_restarts` names every earlier attempt in the report of the one that did not.
"""

from __future__ import annotations

import logging
import queue
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from fleetrl import exit_codes
from fleetrl.config.schema import Config
from fleetrl.watch import link
from fleetrl.watch.incident import DEADLINE_HINT, Incident
from fleetrl.watch.judging.judgement import on_watcher_clock
from fleetrl.watch.judging.last_words import LastWords, how_it_ended, node_name
from fleetrl.watch.judging.node_loss import lost_node
from fleetrl.watch.judging.ray_memory import explain_death
from fleetrl.watch.naming import describe, where
from fleetrl.watch.reporting.hang_report import REPORT_JSON, REPORT_TEXT, record_restarts
from fleetrl.watch.respond import IncidentStop
from fleetrl.watch.watchdog import readable
from fleetrl.watch.watcher import Watcher

__all__ = ["ControllerWatch", "Incident", "keep_report", "record_restarts"]
log = logging.getLogger("fleetrl")
POLL_S = 0.1


def is_readable(record) -> bool:
    try:
        readable(record)
    except TypeError:
        return False
    return True


def keep_report(run_dir: Path, number: int) -> list[Path]:
    """Keep the report of the incident before restart `number` as hang_report-<number>.{json,txt}."""
    kept = []
    for name in (REPORT_JSON, REPORT_TEXT):
        path = run_dir / name
        if path.exists():
            kept.append(path.rename(path.with_name(name.replace(".", f"-{number}."))))
    return kept


class ControllerWatch:
    """The supervisor's `Watcher` over `controller` (a `python -m fleetrl.controller` child), its
    store hosted at `host`; `end_processes` ends every process of the run when a response gives up."""

    def __init__(
        self,
        config: Config,
        run_dir: Path,
        controller: subprocess.Popen,
        component: str,
        host: str,
        secret: bytes,
        end_processes: Callable[[], None],
    ):
        self.config, self.run_dir, self.controller = config, run_dir, controller
        self.watcher = Watcher(config, run_dir, end_processes)
        self.store = self.watcher.open_store(host, secret)
        # its trackers attach the report in the controller: the response waits for them, bounded
        self.watcher.responder.add_report_hook(self.attach_in_controller, config.runner.tracker_timeout_s + 2)
        self.controller_key = (component, 0)
        self.workers: list[dict] = [{"component": component, "rank": 0, "node": 0}]
        self.workers_taken = False  # the controller's published workers are watched
        self.stopped_since: float | None = None  # when the controller was first seen stopped (monotonic)
        self.controller_beat = False  # the controller has published a heartbeat
        self.incidents: queue.Queue[Incident] = queue.Queue()
        self.watch([self.controller_key])
        self.watcher.publish(self.workers)

    def watch(self, keys: list[tuple[str, int]]) -> None:
        """(Re)start the watchdog on `keys`, keeping the timeline it has seen."""
        self.watcher.watch(keys, self.incidents.put, self.read_watched)

    def watchdog_incident(self) -> Incident | None:
        """The incident the watchdog reported, if it has."""
        return None if self.incidents.empty() else self.incidents.get()

    def respond(self, incident: Incident, code: int = exit_codes.INCIDENT) -> int:
        """Stacks, report (the trackers attach it in the controller), whole-tree kill; `code`."""
        watchdog = self.watcher.watchdog
        if watchdog is not None:
            watchdog.stop()
        incident.records = self.records()
        if watchdog is not None and not incident.timeline:
            incident.timeline = list(watchdog.timeline)
        try:
            self.watcher.respond(incident, self.workers, code=code)
        except IncidentStop:
            pass
        except Exception:  # the report failed: say so; the teardown and the exit code stand
            log.exception("the incident response failed for %s: %s", incident.cause, incident.summary)
        return code

    def stop(self) -> None:
        self.watcher.stop()

    def next_incident(self, code: int | None) -> Incident | None:
        """The controller's death, an incident it sent, or one the watchdog saw — in that order."""
        if code is not None:
            return self.controller_died(code)
        failure = link.peek(self.store.sealed, link.FAILURE)
        if failure is not None:
            return self.from_controller(link.incident_from_fields(failure))
        self.follow_controller()
        incident = self.overdue_step() or self.stopped_before_first_beat() or self.watchdog_incident()
        if incident is not None and self.controller.poll() is not None:
            # It ended since the caller's poll: its end comes first, as it explains what the
            # watchdog saw since (on Ray, the actors a killed controller owned end with it).
            return None
        return incident

    def records(self) -> dict:
        """Every watched process's latest heartbeat record that is readable (a broken one is the
        watchdog's to name)."""
        records = self.store.read([(w["component"], w["rank"]) for w in self.workers])
        records = {key: record for key, record in records.items() if is_readable(record)}
        return self.watcher.watchdog.observe(records) if self.watcher.watchdog is not None else records

    def read_watched(self, keys: list[tuple[str, int]]) -> dict:
        """The watchdog's view: inside a declared start-up deadline the controller counts as
        beating (`overdue_step` bounds it instead); while it waits on workers watched in their own
        processes, its wait is not judged (theirs are). Reports show the records as they are."""
        records = self.store.read(keys)
        controller = records.get(self.controller_key)
        if controller is None:
            return records
        if link.peek(self.store.sealed, link.DEADLINE) is not None:  # a beat now, as the watchdog counts beats
            records[self.controller_key] = controller = {**controller, "beat": ("declared step", time.monotonic())}
        if len(keys) > 1 and controller.get("phase") in link.CONTROLLER_WAITS:
            records[self.controller_key] = {**controller, "phase": None, "phase_started": None}
        return records

    def overdue_step(self) -> Incident | None:
        """A start-up step the controller declared (`SupervisedSession.deadline`) past its
        deadline, when the controller could not report it itself (a second later)."""
        step = link.peek(self.store.sealed, link.DEADLINE)
        if step is None or time.time() < step["started"] + step["seconds"] + 1:
            return None
        summary = f"{step['what']} did not finish within {step['seconds']:.0f} s"
        return Incident("startup_timeout", summary, step["started"], self.controller_key, DEADLINE_HINT)

    def stopped_before_first_beat(self) -> Incident | None:
        """The controller stopped (SIGSTOP, a debugger) for heartbeat_timeout_s before it ever
        published a heartbeat: the watchdog would wait startup_allowance_s (300 s) for a first
        beat, but this process is its parent and sees it stopped."""
        self.controller_beat = self.controller_beat or self.controller_key in self.store.read([self.controller_key])
        if self.controller_beat:
            return None  # the watchdog tells a stopped process from its beats
        try:
            stopped = psutil.Process(self.controller.pid).status() == psutil.STATUS_STOPPED
        except psutil.Error:
            return None  # gone: `controller_died` on the next poll
        now = time.monotonic()
        self.stopped_since = (self.stopped_since or now) if stopped else None
        if self.stopped_since is None or now - self.stopped_since < self.config.watchdog.heartbeat_timeout_s:
            return None
        return Incident(
            "process_frozen",
            f"{describe(self.controller_key)} (the controller, pid {self.controller.pid}) is stopped "
            "(SIGSTOP or a debugger) before its first heartbeat",
            time.time() - (now - self.stopped_since),
            self.controller_key,
        )

    def follow_controller(self) -> None:
        """Watch the workers the controller published; stop watching them when it says it is
        shutting them down (their exit is then no incident)."""
        server = self.store.sealed
        published = link.peek(server, link.WORKERS)
        if published is not None and not self.workers_taken:
            self.workers_taken = True
            others = [w for w in published if (w["component"], w["rank"]) != self.controller_key]
            self.workers = [*others, *self.workers]  # workers first: named before the controller waiting on them
            self.watch([(w["component"], w["rank"]) for w in self.workers])
            self.watcher.publish(self.workers)
        if link.peek(server, link.STOPPING) is not None and link.peek(server, link.STOPPING_SEEN) is None:
            self.watch([self.controller_key])
            link.put(server, link.STOPPING_SEEN, True)

    def controller_died(self, code: int) -> Incident:
        record = self.records().get(self.controller_key, {})
        how = how_it_ended("", code)  # this process reaped it: the exit status itself
        was = f"; it was {where(record)}" if record else " before its first heartbeat"
        node = node_name(record.get("node", 0), record.get("host") or socket.gethostname())
        words = LastWords(how, node, "(the controller's stderr is this run's own, printed above this report)")
        return Incident(
            "worker_died",
            f"{describe(self.controller_key)} (the controller, pid {self.controller.pid}) died: {how}{was}; on {node}",
            time.time() - record.get("heartbeat_age_s", 0.0),  # its last beat, on this clock
            self.controller_key,
            last_words=words.as_dict(),
        )

    def from_controller(self, incident: Incident) -> Incident:
        """A dead worker — or a whole node lost — shows up at the controller as errors of the
        others: name the dead one (the node). An incident that starts on a worker's clock
        (`Incident.clock`) is moved onto this one's, through that worker's heartbeats as seen
        here (its arrival, if none were)."""
        records, now = self.records(), time.time()
        if incident.clock is not None:
            record = records.get(incident.clock)
            seen = record is not None and record.get("clock_offset_s") is not None
            incident.started = on_watcher_clock(record, incident.started, now) if seen else now
            incident.clock = None
        if incident.cause == "worker_died" and incident.culprit in records:  # (Ray lost it): its last beat
            incident.started = now - records[incident.culprit]["heartbeat_age_s"]
        if self.watcher.watchdog is None:
            return incident
        dead = self.watcher.watchdog.check_alive(records, now)
        if dead is None and (lost := lost_node(records, now)) is not None:
            key, summary = lost
            dead = Incident("node_lost", summary, now - records[key]["heartbeat_age_s"], key)
        if dead is None:
            return incident
        dead.detail = f"seen by the others as: {incident.summary}"
        return explain_death(dead, f"{incident.summary}\n{incident.detail}")

    def attach_in_controller(self, paths: list[Path]) -> None:
        """Let the controller's report hooks (its trackers) attach the report; returns when they
        are done or the controller cannot run them (gone, or its threads no longer run)."""
        link.put(self.store.sealed, link.REPORT, str(paths[0].parent))
        while self.controller.poll() is None and link.peek(self.store.sealed, link.ATTACHED) is None:
            beat = self.records().get(self.controller_key, {}).get("time", 0)
            if time.time() - beat > max(4 * self.config.watchdog.heartbeat_interval_s, 2.0):  # missed beats
                return
            time.sleep(POLL_S)

    def interrupted(self, with_signal: str, grace: float, seen: Incident | None, asked_at: float) -> Incident:
        records = self.records()
        if seen is not None and seen.culprit in records:
            culprit, why = seen.culprit, f"{seen.cause}: {seen.summary}"
        else:  # the worker in the oldest phase holds the others up
            busy = {key: r for key, r in records.items() if r.get("phase_started")}
            culprit = min(busy, key=lambda key: busy[key]["phase_started"], default=self.controller_key)
            why = f"{describe(culprit)} was {where(records[culprit])}" if culprit in records else "no heartbeat"
        ended = (
            f"the controller did not stop within watchdog.stop_grace_s={grace:g} s"
            if seen is None
            else "the watchdog found an incident while the controller was stopping"
        )
        return Incident(
            "interrupted",
            f"stopped by {with_signal}: {ended}; {why}",
            asked_at,
            culprit,
        )
