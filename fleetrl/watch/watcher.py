"""The watching half of a run, defined once: the heartbeat store, the watchdog reading it, the
incident response, and the bound on that response.

Two processes watch a run, and each holds one `Watcher`: `fleetrl train`'s supervisor
(watch/supervision.py `ControllerWatch`: around the controller process it started, then the
workers that controller publishes) and a `Trainer` that watches itself (watch/session.py
`WatchSession`: around the workers of its own process and the Ray actors it started). They differ
only in what they wrap: which records the watchdog reads, who hears of its incident, and how the
run's processes end when a response gives up (`end_processes`).

Invariant: every response runs `bounded`: past `RESPONSE_BOUND_S` plus the report hooks' own
bounds, the run's processes are ended and this process exits (`exit_codes.INCIDENT`, or the code
given) without it — a report or a teardown that hangs must not leave the run hanging.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from fleetrl import exit_codes
from fleetrl.config.schema import Config
from fleetrl.probe.stack_requests import stack_asker
from fleetrl.probe.store import HeartbeatStore
from fleetrl.teardown import kill_own_children
from fleetrl.watch.attach import WATCH_FILE, advertise, publish_run
from fleetrl.watch.incident import Incident
from fleetrl.watch.respond import Responder
from fleetrl.watch.watchdog import Watchdog

log = logging.getLogger("fleetrl")
# Stacks (py-spy bounded at 5 s a worker), report, teardown (5 s a process tree): past this, plus
# the report hooks' own bounds, the response is stuck and this process ends without it.
RESPONSE_BOUND_S = 60.0


class Watcher:
    def __init__(self, config: Config, run_dir: Path, end_processes: Callable[[], None] = kill_own_children):
        self.config: Config = config
        self.run_dir: Path = Path(run_dir)
        self.end_processes = end_processes  # every process of the run, when a response gives up
        self.store: HeartbeatStore | None = None
        self.watchdog: Watchdog | None = None
        self.responder: Responder = Responder(self.run_dir)

    def open_store(self, host: str, secret: bytes) -> HeartbeatStore:
        """Host the heartbeat store at `host` (an address every watched process reaches), its
        values sealed with the run's `secret`; `<run>/watch.json` says where, for `fleetrl top`
        and `fleetrl stack`."""
        self.store = HeartbeatStore(host, secret)
        self.responder.ask_stacks = stack_asker(self.store.sealed, self.config.watchdog.heartbeat_interval_s)
        advertise(self.run_dir, host, self.store.port, secret)
        return self.store

    def publish(self, workers: list[dict]) -> None:
        """The watched workers ({component, rank, node}) and the watchdog's settings, for `fleetrl top`."""
        publish_run(self.store.sealed, workers, self.config.watchdog)

    def watch(self, keys: list[tuple[str, int]], on_incident: Callable[[Incident], None], read=None) -> None:
        """(Re)start the watchdog on `keys`, keeping the timeline it has seen: their records come
        from `read(keys)` (the store's own by default), its incident goes to `on_incident` in its
        thread. With `watchdog.enabled: false` nothing is watched."""
        old = self.watchdog
        if old is not None:
            old.stop()
        if not self.config.watchdog.enabled:
            return
        self.watchdog = Watchdog(self.config.watchdog, read or self.store.read, keys, on_incident)
        if old is not None:
            self.watchdog.timeline, self.watchdog.seen = old.timeline, old.seen
        self.watchdog.start()

    def response_bound_s(self) -> float:
        """How long an incident response may take: `RESPONSE_BOUND_S` plus the report hooks' bounds."""
        return RESPONSE_BOUND_S + sum(timeout_s for _, timeout_s in self.responder.report_hooks)

    def bounded(self, code: int = exit_codes.INCIDENT) -> contextlib.AbstractContextManager:
        """Bound the response in the block: past `response_bound_s`, end the run's processes and
        exit `code` without it."""
        bound = self.response_bound_s()

        def give_up() -> None:
            log.error("the incident response did not finish within %g s: exiting without it", bound)
            with contextlib.suppress(Exception):
                self.end_processes()
            sys.stderr.flush()
            os._exit(code)

        return expire_after(bound, give_up)

    def respond(
        self,
        incident: Incident,
        workers: list[dict],
        kill_remote: Callable[[], None] = lambda: None,
        exit_process: bool = False,
        code: int = exit_codes.INCIDENT,
    ) -> NoReturn:
        """Stacks, report, teardown (watch/respond.py), bounded; raises IncidentStop, or with
        `exit_process` ends this process."""
        with self.bounded(code):
            self.responder.respond(incident, workers, kill_remote, exit_process)

    def stop(self) -> None:
        """Stop watching (the store stays up for the processes still writing to it)."""
        if self.watchdog is not None:
            self.watchdog.stop()
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
