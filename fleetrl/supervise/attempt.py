"""One controller process of a supervised run, from spawn to exit (supervise/supervisor.py starts one
per attempt): its own heartbeat store, a watchdog on the controller from its first instant and on
the workers it publishes (watch/link.py), the incident response, and the stop on a signal.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil

from fleetrl import exit_codes
from fleetrl.checkpoint import list_checkpoints, newest_intact
from fleetrl.cluster.isolation.bridge import bridge_name, remove_bridge
from fleetrl.cluster.isolation.nodes import sweep_stale
from fleetrl.config.schema import Config
from fleetrl.controller.orders import Orders
from fleetrl.probe.stack_requests import stack_asker
from fleetrl.probe.store import HeartbeatStore
from fleetrl.supervise.store_address import store_address
from fleetrl.teardown import kill_own_children
from fleetrl.watch import link
from fleetrl.watch.attach import WATCH_FILE, advertise, publish_run
from fleetrl.watch.incident import Incident
from fleetrl.watch.judging.judgement import on_watcher_clock
from fleetrl.watch.judging.last_words import LastWords, how_it_ended, node_name
from fleetrl.watch.judging.node_loss import lost_node
from fleetrl.watch.naming import describe, where
from fleetrl.watch.respond import IncidentStop, Responder
from fleetrl.watch.session import DEADLINE_HINT, RESPONSE_BOUND_S, expire_after
from fleetrl.watch.watchdog import Watchdog, readable

log = logging.getLogger("fleetrl")
POLL_S = 0.1
RUN_MARK = "FLEETRL_SUPERVISOR_PID"  # in the environment of every process of the run


def is_readable(record) -> bool:
    try:
        readable(record)
    except TypeError:
        return False
    return True


def kill_run_tree(config: Config, controller_pid: int | None = None) -> None:
    """Every process the run started; with an isolated simulation also its namespaces, links and
    folder, which outlive the processes killed, and the bridge built for controller
    `controller_pid` (supervise/store_address.py), which the controller never removes: its store
    listens there. Both the end of an attempt and a second Ctrl-C."""
    kill_own_children()
    if config.cluster.simulate_isolation == "namespaces":
        if controller_pid is not None:
            remove_bridge(bridge_name(controller_pid))  # gone with the attempt, not a leftover to sweep
        sweep_stale()


class Attempt:
    """One controller process from spawn to exit, watched; `run` returns (exit code, the
    incident that ended it or None)."""

    def __init__(self, supervisor, restart: dict | None):  # a watch.supervisor.Supervisor
        self.supervisor, self.config, self.run_dir = supervisor, supervisor.config, supervisor.run_dir
        # Started first, it waits for its orders on stdin: where the store listens may be named
        # for it (an isolated simulation's bridge: supervise/store_address.py).
        self.controller = subprocess.Popen(
            [sys.executable, "-m", "fleetrl.controller"],
            stdin=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, RUN_MARK: str(os.getpid())},
        )
        try:
            host = store_address(self.config.cluster, supervisor.component == "inline", self.controller.pid)
            self.store = HeartbeatStore(host, supervisor.secret)
        except BaseException:
            self.controller.kill()
            self.controller.wait()
            kill_run_tree(self.config, self.controller.pid)
            raise
        self.controller_key = (supervisor.component, 0)
        self.workers: list[dict] = [{"component": supervisor.component, "rank": 0, "node": 0}]
        self.workers_taken = False  # the controller's published workers are watched
        self.stopped_since: float | None = None  # when the controller was first seen stopped (monotonic)
        self.controller_beat = False  # the controller has published a heartbeat
        self.incidents: queue.Queue[Incident] = queue.Queue()
        self.watchdog: Watchdog | None = None
        self.watch([self.controller_key])
        advertise(self.run_dir, host, self.store.port, supervisor.secret)  # for `fleetrl top` / `fleetrl stack`
        publish_run(self.store.sealed, self.workers, self.config.watchdog)
        resume = (
            str(self.run_dir) if list_checkpoints(self.run_dir) and (restart or self.config.runner.resume) else None
        )
        plan = replace(supervisor.plan, config=replace(self.config, runner=replace(self.config.runner, resume=resume)))
        orders = Orders(plan, str(self.run_dir), host, self.store.port, supervisor.component, os.getpid(), restart)
        self.controller.stdin.write(pickle.dumps(orders))
        self.controller.stdin.close()

    def watch(self, keys: list[tuple[str, int]]) -> None:
        """(Re)start the watchdog on `keys`, keeping the timeline it has seen."""
        old = self.watchdog
        if old is not None:
            old.stop()
        if not self.config.watchdog.enabled:
            return
        self.watchdog = Watchdog(self.config.watchdog, self.read_watched, keys, self.incidents.put)
        if old is not None:
            self.watchdog.timeline, self.watchdog.seen = old.timeline, old.seen
        self.watchdog.start()

    def run(self) -> tuple[int, Incident | None]:
        try:
            while True:
                if self.supervisor.signals:
                    return self.stop(self.supervisor.signals[0]), None
                code = self.controller.poll()
                if code in (exit_codes.OK, exit_codes.USER_ERROR):
                    return code, None
                incident = self.next_incident(code)
                if incident is not None:
                    return self.respond(incident), incident
                time.sleep(POLL_S)
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
            kill_run_tree(self.config, self.controller.pid)
            (self.run_dir / WATCH_FILE).unlink(missing_ok=True)

    def next_incident(self, code: int | None) -> Incident | None:
        """The controller's death, an incident it sent, or one the watchdog saw — in that order."""
        if code is not None:
            return self.controller_died(code)
        failure = link.peek(self.store.sealed, link.FAILURE)
        if failure is not None:
            return self.from_controller(link.incident_from_fields(failure))
        self.follow_controller()
        return (
            self.overdue_step()
            or self.stopped_before_first_beat()
            or (None if self.incidents.empty() else self.incidents.get())
        )

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
            publish_run(server, self.workers, self.config.watchdog)
        if link.peek(server, link.STOPPING) is not None and link.peek(server, link.STOPPING_SEEN) is None:
            self.watch([self.controller_key])
            link.put(server, link.STOPPING_SEEN, True)

    def records(self) -> dict:
        """Every watched process's latest heartbeat record that is readable (a broken one is the
        watchdog's to name)."""
        records = self.store.read([(w["component"], w["rank"]) for w in self.workers])
        records = {key: record for key, record in records.items() if is_readable(record)}
        return self.watchdog.observe(records) if self.watchdog is not None else records

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
        if self.watchdog is None:
            return incident
        dead = self.watchdog.check_alive(records, now)
        if dead is None and (lost := lost_node(records, now)) is not None:
            key, summary = lost
            dead = Incident("node_lost", summary, now - records[key]["heartbeat_age_s"], key)
        if dead is None:
            return incident
        dead.detail = f"seen by the others as: {incident.summary}"
        return dead

    def respond(self, incident: Incident, code: int = exit_codes.INCIDENT) -> int:
        """Stacks, report (the trackers attach it in the controller), whole-tree kill; `code`."""
        if self.watchdog is not None:
            self.watchdog.stop()
        incident.records = self.records()
        if self.watchdog is not None and not incident.timeline:
            incident.timeline = list(self.watchdog.timeline)
        responder = Responder(self.run_dir)
        responder.ask_stacks = stack_asker(self.store.sealed, self.config.watchdog.heartbeat_interval_s)
        responder.add_report_hook(self.attach_in_controller, self.config.runner.tracker_timeout_s + 2)
        bound = RESPONSE_BOUND_S + self.config.runner.tracker_timeout_s + 2

        def give_up() -> None:
            log.error("the incident response did not finish within %g s: exiting without it", bound)
            kill_run_tree(self.config, self.controller.pid)
            os._exit(code)

        with expire_after(bound, give_up):
            try:
                responder.respond(incident, self.workers)
            except IncidentStop:
                pass
            except Exception:  # the report failed: say so; the teardown and the exit code stand
                log.exception("the incident response failed for %s: %s", incident.cause, incident.summary)
        return code

    def attach_in_controller(self, paths: list[Path]) -> None:
        """Let the controller's report hooks (its trackers) attach the report; returns when they
        are done or the controller cannot run them (gone, or its threads no longer run)."""
        link.put(self.store.sealed, link.REPORT, str(paths[0].parent))
        while self.controller.poll() is None and link.peek(self.store.sealed, link.ATTACHED) is None:
            beat = self.records().get(self.controller_key, {}).get("time", 0)
            if time.time() - beat > max(4 * self.config.watchdog.heartbeat_interval_s, 2.0):  # missed beats
                return
            time.sleep(POLL_S)

    def stop(self, signum: int) -> int:
        """The first stop signal: the controller checkpoints and stops within the grace, or is
        reported (`interrupted`, naming who was stuck where) and killed."""
        code, grace = exit_codes.stopped_by(signum), self.config.watchdog.stop_grace_s
        with_signal = signal.Signals(signum).name
        print(
            f"fleetrl: {with_signal}: asking the controller to checkpoint and stop (within {grace:g} s)",
            file=sys.stderr,
        )
        self.controller.send_signal(signum)
        asked_at, deadline, seen = time.time(), time.monotonic() + grace, None
        while time.monotonic() < deadline and self.controller.poll() is None and seen is None:
            self.follow_controller()
            seen = None if self.incidents.empty() else self.incidents.get()
            time.sleep(POLL_S)
        if self.controller.poll() is None:
            self.respond(self.interrupted(with_signal, grace, seen, asked_at), code)
        print(closing_message(self.run_dir, code), file=sys.stderr)
        return code

    def interrupted(self, with_signal: str, grace: float, seen: Incident | None, asked_at: float) -> Incident:
        records = self.records()
        if seen is not None and seen.culprit in records:
            culprit, why = seen.culprit, f"{seen.cause}: {seen.summary}"
        else:  # the worker in the oldest phase holds the others up
            busy = {key: r for key, r in records.items() if r.get("phase_started")}
            culprit = min(busy, key=lambda key: busy[key]["phase_started"], default=self.controller_key)
            why = f"{describe(culprit)} was {where(records[culprit])}" if culprit in records else "no heartbeat"
        return Incident(
            "interrupted",
            f"stopped by {with_signal}: the controller did not stop within watchdog.stop_grace_s={grace:g} s; {why}",
            asked_at,
            culprit,
        )


def closing_message(run_dir: Path, code: int) -> str:
    checkpoint = newest_intact(run_dir)
    kept = f"the newest intact checkpoint is {checkpoint}" if checkpoint else "there is no checkpoint (none was saved)"
    return f"fleetrl: stopped by {exit_codes.stop_signal(code).name}; {kept}"
