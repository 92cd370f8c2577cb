"""The controller's side of a supervised run (`fleetrl train`): the same `WatchSession` facade the
backends use, but the store, the watchdog and the incident response live in the supervisor
(supervise/supervisor.py), which watches this process like any worker.

`open_store` hands out the supervisor's store; `watch_here` is the controller's own recorder
(`inline rank 0` on the inline backend, `controller rank 0` elsewhere); `start` tells the
supervisor which workers to watch; `fail` and an expired `deadline` send the incident to the
supervisor as plain data (watch/link.py) and wait to be ended by it; `on_report` hooks run here
once the supervisor says the report is written, and the supervisor waits for them (bounded).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from fleetrl import exit_codes
from fleetrl.config.schema import Config
from fleetrl.probe.flight_recorder import Recorder, join_unless_current
from fleetrl.probe.recorded_calls import WatchSpec
from fleetrl.watch import link
from fleetrl.watch.incident import DEADLINE_HINT, Incident
from fleetrl.watch.judging.classify import incident_from_error
from fleetrl.watch.session import WatchSession
from fleetrl.watch.watcher import expire_after

log = logging.getLogger("fleetrl")
LISTEN_INTERVAL_S = 0.2


class SupervisedSession(WatchSession):
    def __init__(self, config: Config, run_dir: Path, store, spec: WatchSpec, recorder: Recorder):
        super().__init__(config, run_dir)
        self.link = store  # a client of the supervisor's store (a SealedStore)
        self.spec = spec  # where the supervisor's store listens, and the run's secret
        self.recorder = recorder
        self.listening = threading.Event()
        self.listener = threading.Thread(target=self.attach_report_when_written, name="fleetrl-report", daemon=True)
        self.listener.start()

    def open_store(self, host: str) -> WatchSpec:
        """The supervisor's store, at the address it listens on (the supervisor chose the one its
        workers reach, `host` here: supervise/store_address.py)."""
        return replace(self.spec, fault=self.fault)

    def watch_here(self, component: str, rank: int, spec: WatchSpec) -> Recorder:
        return self.recorder

    def start(self, workers: list[dict], remote=None) -> None:
        self.workers, self.remote = workers, remote
        link.put(self.link, link.WORKERS, workers)

    def fail(self, error: BaseException) -> NoReturn:
        self.send(incident_from_error(error, {}, self.remote, self.run_dir))

    @contextlib.contextmanager
    def deadline(self, seconds: float, what: str) -> Iterator[None]:
        """The step is declared to the supervisor, which enforces its deadline even when this
        process cannot (its GIL held); the timer here reports it first when it can."""
        started = time.time()

        def expire() -> None:
            summary = f"{what} did not finish within {seconds:.0f} s"
            self.send(Incident("startup_timeout", summary, started, None, DEADLINE_HINT))

        link.put(self.link, link.DEADLINE, {"what": what, "started": started, "seconds": seconds})
        try:
            with expire_after(seconds, expire):
                yield
        finally:
            link.put(self.link, link.DEADLINE, None)

    def send(self, incident: Incident) -> NoReturn:
        """Hand the incident to the supervisor, which reports it and ends this process; should it
        not (it is gone: the parent-death signal ends us first), end without it."""
        self.interrupt.set()
        link.put(self.link, link.FAILURE, link.incident_fields(incident))
        time.sleep(self.watcher.response_bound_s())
        log.error("the supervisor did not end this controller after %s: exiting", incident.cause)
        os._exit(exit_codes.INCIDENT)

    def attach_report_when_written(self) -> None:
        while not self.listening.wait(LISTEN_INTERVAL_S):
            try:
                written = link.peek(self.link, link.REPORT)
            except Exception:  # the supervisor is ending this process
                return
            if written is not None:
                self.watcher.responder.run_report_hooks(Path(written))
                link.put(self.link, link.ATTACHED, True)
                return

    def stop(self) -> None:
        """Watching ends before the workers are shut down (their exit is no incident); the
        supervisor still watches this process until it exits."""
        link.put(self.link, link.STOPPING, True)
        deadline = time.monotonic() + 10
        while link.peek(self.link, link.STOPPING_SEEN) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self.listening.set()
        join_unless_current(self.listener)
