"""The trackers `runner.loggers` names, each behind a bound: a tracker never stops or stalls a run.

Invariant: every call to a tracker returns to the caller within `runner.tracker_timeout_s`. Each
tracker runs in its own daemon thread; a call is handed to that thread and waited for up to the
bound. A tracker that raises (not installed, no credentials, a refused connection) or does not
return in time (an unreachable server) is dropped with ONE warning naming it and what failed, and
is never called again; the others, and training, go on. A call abandoned past its bound is left
to its daemon thread, which cannot keep the process from exiting.
"""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path

from fleetrl.checkpoint import full_disk
from fleetrl.config.schema import Config
from fleetrl.tracking.base import Tracker
from fleetrl.tracking.jsonl import JsonlTracker
from fleetrl.tracking.mlflow_run import MlflowTracker
from fleetrl.tracking.tensorboard import TensorBoardTracker
from fleetrl.tracking.wandb_run import WandbTracker

log = logging.getLogger("fleetrl")

TRACKER_TYPES: dict[str, type[Tracker]] = {
    "jsonl": JsonlTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}
EXTRAS = {"wandb": "wandb", "mlflow": "mlflow"}  # pip install 'fleetrl[<extra>]'


class GuardedTracker:
    """One tracker, called only from its own thread, each call waited for at most `timeout_s`."""

    def __init__(self, name: str, tracker: Tracker, timeout_s: float):
        self.name, self.tracker, self.timeout_s = name, tracker, timeout_s
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.dropped = False
        self.lock = threading.Lock()
        threading.Thread(target=self.serve, name=f"fleetrl-tracker-{name}", daemon=True).start()

    def serve(self) -> None:
        while (call := self.calls.get()) is not None:
            method, args, done, errors = call
            try:
                getattr(self.tracker, method)(*args)
            except BaseException as error:  # anything a tracker raises is its own failure
                errors.append(error)
            done.set()

    def call(self, method: str, *args) -> None:
        if self.dropped:
            return
        done, errors = threading.Event(), []
        self.calls.put((method, args, done, errors))
        if not done.wait(self.timeout_s):
            self.drop(f"{method} did not return within {self.timeout_s:g} s (runner.tracker_timeout_s)")
        elif errors:
            error = errors[0]
            if self.name == "jsonl" and full_disk(error):  # the run's own record: a disk_full incident
                raise error
            hint = (
                f"; install it with pip install 'fleetrl[{EXTRAS[self.name]}]'"
                if isinstance(error, ImportError) and self.name in EXTRAS
                else ""
            )
            self.drop(f"{method} raised {type(error).__name__}: {error}{hint}")

    def drop(self, why: str) -> None:
        with self.lock:
            if self.dropped:
                return
            self.dropped = True
        log.warning("tracker %s failed and is switched off, training goes on without it: %s", self.name, why)

    def stop(self) -> None:
        """End the thread once its calls are done (a thread stuck in a call stays, as a daemon)."""
        self.calls.put(None)


class Trackers:
    """All trackers of a run: every method calls each live tracker in turn, each one bounded."""

    def __init__(self, names: list[str], timeout_s: float):
        self.names = list(dict.fromkeys(names))  # in order, once each
        self.timeout_s = timeout_s
        self.guarded: list[GuardedTracker] = []
        self.closed = False

    def start(self, config: Config, run_dir: Path) -> None:
        for name in self.names:
            guarded = GuardedTracker(name, TRACKER_TYPES[name](), self.timeout_s)
            guarded.call("start", config, Path(run_dir))
            self.guarded.append(guarded)

    def log_metrics(self, record: dict, step: int) -> None:
        self.each("log_metrics", record, step)

    def log_file(self, path: Path, name: str | None = None) -> None:
        self.each("log_file", Path(path), name or Path(path).name)

    def log_summary(self, summary: dict) -> None:
        self.each("log_summary", summary)

    def each(self, method: str, *args) -> None:
        if not self.closed:
            for guarded in self.guarded:
                guarded.call(method, *args)

    def close(self, failed: bool = False) -> None:
        """End every tracker's run (once; later calls do nothing)."""
        if self.closed:
            return
        self.closed = True
        for guarded in self.guarded:
            guarded.call("close", failed)
            guarded.stop()

    def attach_report(self, paths: list[Path]) -> None:
        """On an incident: attach the hang report to every run and end them as failed."""
        for path in paths:
            self.log_file(path)
        self.close(failed=True)
