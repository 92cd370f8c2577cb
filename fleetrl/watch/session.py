"""The watching side of one run, behind one object: heartbeat store, watchdog, incident response.

Invariant: from the moment a worker process exists until `stop`, any stall, death, desync or
worker error ends in exactly one hang report and a teardown (exit code 4), and a start-up step
that hangs (`deadline`) ends the same way, as `startup_timeout`. The watchdog failing is itself an
incident (`watchdog_error`), and every incident response is bounded (`RESPONSE_BOUND_S` plus the
report hooks' own bounds): a response that fails or hangs still ends this process with exit 4.

The backends use this object and nothing else of `fleetrl.watch` to be watched: `open_store`
(where workers beat: a `WatchSpec` they can carry to any process), `watch_here` (this process as
a worker), `start` (watch these workers; how to end remote ones), `interrupt` (set once the
watchdog reports: waits give up), `fail(error)`, `deadline(seconds, what)`, `stop`; the runner
adds `on_report(hook, timeout_s)` (the trackers attach the report before the exit). Everything
crossing this seam is plain data — the spec, worker records, an error — so that under `fleetrl
train` the supervisor owns the store and the watchdog and `SupervisedSession`
(watch/supervised.py) stands in for this class without the backends changing. This class is the
in-process form: a `Trainer` used as a library watches itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from fleetrl import exit_codes
from fleetrl.config.schema import Config, WatchdogConfig
from fleetrl.probe import flight_recorder
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.probe.recorded_calls import WatchSpec
from fleetrl.probe.seal import run_secret
from fleetrl.probe.stack_requests import StackAnswerer, stack_asker
from fleetrl.probe.stacks import register_stack_dump, stack_file
from fleetrl.probe.store import HeartbeatStore
from fleetrl.teardown import kill_own_children
from fleetrl.watch.attach import WATCH_FILE, advertise, publish_run
from fleetrl.watch.incident import Incident
from fleetrl.watch.judging.classify import RemoteWorkers, incident_from_error
from fleetrl.watch.respond import Responder
from fleetrl.watch.watchdog import Watchdog

log = logging.getLogger("fleetrl")
# Stacks (py-spy bounded at 5 s a worker), report, teardown (5 s a process tree): past this, plus
# the report hooks' own bounds, the response is stuck and this process ends without it.
RESPONSE_BOUND_S = 60.0
DEADLINE_HINT = "Check the address and that the network interface it names is reachable from here (`fleetrl doctor`)."


class WatchSession:
    def __init__(self, config: Config, run_dir: Path):
        self.config: WatchdogConfig = config.watchdog
        self.fault: dict = config.debug.fault
        self.run_dir: Path = Path(run_dir)
        self.store: HeartbeatStore | None = None
        self.watchdog: Watchdog | None = None
        self.recorder: Recorder | None = None  # this process's own, when it hosts workers (inline)
        self.workers: list[dict] = []  # {component, rank, node} of every watched process
        self.remote: RemoteWorkers | None = None
        self.interrupt: threading.Event = threading.Event()  # the watchdog is reporting: stop waiting
        self.responder: Responder = Responder(self.run_dir)
        self.torn_down: bool = False  # an incident already ended the remote workers

    def open_store(self, host: str) -> WatchSpec:
        """Host the heartbeat store at `host` (an address every worker reaches); what a worker
        needs to be watched."""
        secret = run_secret()
        self.store = HeartbeatStore(host, secret)
        self.responder.ask_stacks = stack_asker(self.store.sealed, self.config.heartbeat_interval_s)
        advertise(self.run_dir, host, self.store.port, secret)  # for `fleetrl top` / `fleetrl stack`
        return WatchSpec(
            host, self.store.port, self.config.heartbeat_interval_s, str(self.run_dir / "stacks"), self.fault, secret
        )

    def watch_here(self, component: str, rank: int, spec: WatchSpec) -> Recorder:
        """This process as a watched worker: its recorder, heartbeats, stack dumps on SIGUSR1."""
        self.recorder = Recorder(component, rank, 0)
        flight_recorder.install(self.recorder)
        register_stack_dump(stack_file(Path(spec.stack_dir), component, rank))
        answer = StackAnswerer(self.store.sealed, component, rank)
        self.recorder.start_publishing(self.store.publisher(component, rank), spec.interval_s, answer)
        return self.recorder

    def start(self, workers: list[dict], remote: RemoteWorkers | None = None) -> None:
        """Watch `workers` ({component, rank, node}) until `stop`; `remote` ends the ones this
        process did not fork when an incident is reported."""
        self.workers, self.remote = workers, remote
        publish_run(self.store.sealed, workers, self.config)
        if not self.config.enabled:
            return
        self.watchdog = Watchdog(self.config, self.store.read, self.keys(), self.on_watchdog_incident)
        self.watchdog.start()

    def keys(self) -> list[tuple[str, int]]:
        return [(w["component"], w["rank"]) for w in self.workers]

    def on_watchdog_incident(self, incident: Incident) -> NoReturn:
        """In the watchdog's thread: the main thread may be stuck for good, so end the process."""
        self.interrupt.set()  # waits in the main thread give up (cluster/groups.py RayGroup.get)
        kill_remote = self.remote.kill_remote_workers if self.remote else lambda: None
        with self.bounded_response():
            self.responder.respond(incident, self.workers, kill_remote, exit_process=True)

    def fail(self, error: BaseException) -> NoReturn:
        """A worker's error reached the main thread: report it as an incident, tear down, raise
        IncidentStop. Unwatched (no watchdog): end the children and raise the error itself.
        If the watchdog is already reporting, `stop` joins it and `respond` waits for it."""
        if self.watchdog is None:
            kill_own_children()
            raise error
        self.watchdog.stop()
        records, _ = self.watchdog.readable_records()
        # A dead worker shows up at the others as errors ("connection reset by peer"): name the
        # dead one as the cause, with the survivor's error as detail.
        incident = self.watchdog.check_alive(records, time.time())
        if incident is None:
            incident = incident_from_error(error, records, self.remote, self.run_dir)
        else:
            incident.detail = f"seen by the others as: {error}"
        incident.records = records
        with self.bounded_response():
            self.responder.respond(incident, self.workers, self.stop_remote_after_incident)

    def bounded_response(self) -> contextlib.AbstractContextManager:
        """Bound the incident response in the block: past its bound, end this process's children
        and exit 4 without it (a teardown that hangs must not leave the run hanging)."""
        bound = RESPONSE_BOUND_S + sum(timeout_s for _, timeout_s in self.responder.report_hooks)

        def give_up() -> None:
            log.error("the incident response did not finish within %g s: exiting without it", bound)
            with contextlib.suppress(Exception):
                kill_own_children()
            sys.stderr.flush()
            os._exit(exit_codes.INCIDENT)

        return expire_after(bound, give_up)

    def stop_remote_after_incident(self) -> None:
        if self.remote is not None:
            self.remote.stop_after_incident()
            self.torn_down = True

    def on_report(self, hook: Callable[[list[Path]], None], timeout_s: float) -> None:
        """On an incident, once the report is written: `hook(report paths)`, bounded by `timeout_s`."""
        self.responder.add_report_hook(hook, timeout_s)

    def deadline(self, seconds: float, what: str) -> contextlib.AbstractContextManager:
        """Bound a blocking start-up step: past `seconds`, report `startup_timeout` naming `what`
        and end this process (and the daemons it started) instead of waiting silently."""
        started = time.time()

        def expire() -> None:
            incident = Incident(
                "startup_timeout", f"{what} did not finish within {seconds:.0f} s", started, None, DEADLINE_HINT
            )
            self.interrupt.set()
            with self.bounded_response():
                self.responder.respond(incident, self.workers, exit_process=True)

        return expire_after(seconds, expire)

    def stop(self) -> None:
        """Stop the threads that use the heartbeat store (before its process goes)."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.recorder is not None:
            self.recorder.stop()
        (self.run_dir / WATCH_FILE).unlink(missing_ok=True)


@contextlib.contextmanager
def expire_after(seconds: float, expire: Callable[[], None]) -> Iterator[None]:
    """Run `expire` in a timer thread if the block has not finished within `seconds`."""
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
