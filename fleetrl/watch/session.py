"""The watching side of one run as the backends see it, behind one object; in this form a `Trainer`
used alone watches itself, its `Watcher` (watch/watcher.py: heartbeat store, watchdog, bounded
incident response) hosted in its own process.

Invariant: from the moment a worker process exists until `stop`, any stall, death, desync or
worker error ends in exactly one hang report and a teardown (exit code 4), and a start-up step
that hangs (`deadline`) ends the same way, as `startup_timeout`. The watchdog failing is itself an
incident (`watchdog_error`), and every incident response is bounded (`Watcher.bounded`): a
response that fails or hangs still ends this process with exit 4.

The backends are watched through this object alone: `open_store` (where workers beat: a
`WatchSpec` they can carry to any process), `watch_here` (this process as a worker), `start`
(watch these workers; how to end remote ones), `interrupt` (set once the watchdog reports: waits
give up), `fail(error)`, `deadline(seconds, what)`, `stop`; the training loop adds
`on_report(hook, timeout_s)` (the trackers attach the report before the exit). Besides it they
use only the verdict's words: `IncidentStop`, a worker's error (`judging.classify.worker_error`)
and a dead Ray worker's last words (`judging.last_words`), which the Ray cluster reads on its node. Everything
crossing this seam is plain data — the spec, worker records, an error — so that under `fleetrl
train` the supervisor owns the store and the watchdog and `SupervisedSession`
(watch/supervised.py) stands in for this class without the backends changing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from fleetrl.config.schema import Config
from fleetrl.probe import flight_recorder
from fleetrl.probe.child_activity import become_subreaper
from fleetrl.probe.flight_recorder import Recorder
from fleetrl.probe.recorded_calls import WatchSpec
from fleetrl.probe.seal import run_secret
from fleetrl.probe.stack_requests import StackAnswerer
from fleetrl.probe.stacks import register_stack_dump, stack_file
from fleetrl.teardown import kill_own_children
from fleetrl.watch.incident import DEADLINE_HINT, Incident
from fleetrl.watch.judging.classify import RemoteWorkers, incident_from_error
from fleetrl.watch.judging.ray_memory import explain_death
from fleetrl.watch.watcher import Watcher, expire_after


class WatchSession:
    def __init__(self, config: Config, run_dir: Path):
        self.watcher: Watcher = Watcher(config, run_dir)  # store, watchdog, response: this process hosts them
        self.fault: dict = config.debug.fault
        self.run_dir: Path = Path(run_dir)
        self.recorder: Recorder | None = None  # this process's own, when it hosts workers (inline)
        self.workers: list[dict] = []  # {component, rank, node} of every watched process
        self.remote: RemoteWorkers | None = None
        self.interrupt: threading.Event = threading.Event()  # the watchdog is reporting: stop waiting
        self.torn_down: bool = False  # an incident already ended the remote workers

    def open_store(self, host: str) -> WatchSpec:
        """Host the heartbeat store at `host` (an address every worker reaches); what a worker
        needs to be watched."""
        secret = run_secret()
        store = self.watcher.open_store(host, secret)
        interval = self.watcher.config.watchdog.heartbeat_interval_s
        return WatchSpec(host, store.port, interval, str(self.run_dir / "stacks"), self.fault, secret)

    def watch_here(self, component: str, rank: int, spec: WatchSpec) -> Recorder:
        """This process as a watched worker: its recorder, heartbeats, stack dumps on SIGUSR1."""
        store = self.watcher.store
        self.recorder = Recorder(component, rank, 0)
        flight_recorder.install(self.recorder)
        become_subreaper()  # a simulator's daemonised servers stay its descendants (probe/child_activity.py)
        register_stack_dump(stack_file(Path(spec.stack_dir), component, rank))
        answer = StackAnswerer(store.sealed, component, rank)
        self.recorder.start_publishing(store.publisher(component, rank), spec.interval_s, answer)
        return self.recorder

    def start(self, workers: list[dict], remote: RemoteWorkers | None = None) -> None:
        """Watch `workers` ({component, rank, node}) until `stop`; `remote` ends the ones this
        process did not fork when an incident is reported."""
        self.workers, self.remote = workers, remote
        self.watcher.publish(workers)
        self.watcher.watch([(w["component"], w["rank"]) for w in workers], self.on_watchdog_incident)

    def on_watchdog_incident(self, incident: Incident) -> NoReturn:
        """In the watchdog's thread: the main thread may be stuck for good, so end the process."""
        self.interrupt.set()  # waits in the main thread give up (cluster/groups.py RayGroup.get)
        kill_remote = self.remote.kill_remote_workers if self.remote else lambda: None
        self.watcher.respond(incident, self.workers, kill_remote, exit_process=True)

    def fail(self, error: BaseException) -> NoReturn:
        """A worker's error reached the main thread: report it as an incident, tear down, raise
        IncidentStop. Unwatched (no watchdog): end the children and raise the error itself.
        If the watchdog is already reporting, `stop` joins it and `respond` waits for it."""
        watchdog = self.watcher.watchdog
        if watchdog is None:
            kill_own_children()
            raise error
        watchdog.stop()
        records, _ = watchdog.readable_records()
        # A dead worker shows up at the others as errors ("connection reset by peer"): name the
        # dead one as the cause, with the survivor's error as detail.
        incident = watchdog.check_alive(records, time.time())
        if incident is None:
            incident = incident_from_error(error, records, self.remote, self.run_dir)
        else:
            incident.detail = f"seen by the others as: {error}"
            incident = explain_death(incident, str(error))
        incident.records = records
        self.watcher.respond(incident, self.workers, self.stop_remote_after_incident)

    def stop_remote_after_incident(self) -> None:
        if self.remote is not None:
            self.remote.stop_after_incident()
            self.torn_down = True

    def on_report(self, hook: Callable[[list[Path]], None], timeout_s: float) -> None:
        """On an incident, once the report is written: `hook(report paths)`, bounded by `timeout_s`."""
        self.watcher.responder.add_report_hook(hook, timeout_s)

    def deadline(self, seconds: float, what: str) -> contextlib.AbstractContextManager:
        """Bound a blocking start-up step: past `seconds`, report `startup_timeout` naming `what`
        and end this process (and the daemons it started) instead of waiting silently."""
        started = time.time()

        def expire() -> None:
            incident = Incident(
                "startup_timeout", f"{what} did not finish within {seconds:.0f} s", started, None, DEADLINE_HINT
            )
            self.interrupt.set()
            self.watcher.respond(incident, self.workers, exit_process=True)

        return expire_after(seconds, expire)

    def stop(self) -> None:
        """Stop the threads that use the heartbeat store (before its process goes)."""
        self.watcher.stop()
        if self.recorder is not None:
            self.recorder.stop()
