"""How a worker runs the controller's calls: each one a recorded phase, with faults injected
where `debug.fault` says. Used by the Ray worker host and by the inline groups alike.

A call arrives as the method's name: the controller names the method by its function object
(`group.call(rank, EnvWorker.step, ...)`), and its group checks it against the worker class and
sends the name (cluster/groups.py). Here `getattr` resolves it on the worker itself, so a
subclass's override runs."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fleetrl.probe import flight_recorder
from fleetrl.probe.child_activity import become_subreaper
from fleetrl.probe.flight_recorder import PhaseStats, Recorder
from fleetrl.probe.stack_requests import connect_answerer
from fleetrl.probe.stacks import register_stack_dump, stack_file
from fleetrl.probe.store import connect_publisher


@dataclass(frozen=True)
class WatchSpec:
    """What a worker process needs to be watched: where to beat, how often, where stacks go."""

    store_host: str
    store_port: int
    interval_s: float
    stack_dir: str
    fault: dict
    secret: bytes = field(repr=False)  # the run's (probe/seal.py): seals heartbeats, authenticates direct channels


def start_watching(component: str, rank: int, node: int, spec: WatchSpec) -> Recorder:
    """In a worker process: install its recorder, publish heartbeats, answer stack requests
    (through the store, and SIGUSR1 from its own machine)."""
    recorder = Recorder(component, rank, node)
    flight_recorder.install(recorder)
    become_subreaper()  # a simulator's daemonised servers stay its descendants (probe/child_activity.py)
    register_stack_dump(stack_file(Path(spec.stack_dir), component, rank))
    publish = connect_publisher(spec.store_host, spec.store_port, component, rank, spec.secret)
    answer = connect_answerer(spec.store_host, spec.store_port, component, rank, spec.secret)
    recorder.start_publishing(publish, spec.interval_s, answer)
    return recorder


class WorkerError(RuntimeError):
    """An exception inside a worker, labelled with who raised it, where and when (`raised_at`,
    epoch seconds: the incident starts there, not when the controller learns of it), and its
    traceback as text — it survives pickling through Ray and being passed along as another call's
    argument. `raised_at` is on the clock of the watched process that raised it, `clock`
    (component, rank: `inline rank 0` for an inline worker, `fused rank r` for a fused one); the
    watcher moves it onto its own clock through that process's heartbeats (watch/judging/judgement.py
    `on_watcher_clock`): machines' clocks differ."""

    def __init__(
        self,
        component: str,
        rank: int,
        phase: str,
        error_type: str,
        message: str,
        trace: str,
        raised_at: float,
        clock: tuple[str, int] | None = None,
    ):
        super().__init__(component, rank, phase, error_type, message, trace, raised_at, clock)
        self.component, self.rank, self.phase = component, rank, phase
        self.error_type, self.message, self.trace, self.raised_at = error_type, message, trace, raised_at
        self.clock = tuple(clock) if clock else None

    def __str__(self) -> str:
        return f"{self.component} rank {self.rank} raised {self.error_type} in {self.phase}: {self.message}"


class Faults(Protocol):
    """Where a fault strikes (`debug.faults.FaultPlan`, built where faults are injected: the backends)."""

    armed: bool

    def fires(self, method: str) -> bool: ...

    def strike(self, worker, phase: str, method: str, *args): ...


class RecordedCalls:
    """Runs the method named `method` of `worker` as phase 'component.method'. An error names
    the process it ran in: `process` (e.g. 'fused' for a rank that hosts all three components),
    by default the component itself."""

    def __init__(
        self, worker, component: str, rank: int, recorder: Recorder, faults: Faults, process: str | None = None
    ):
        self.worker, self.component, self.rank = worker, component, rank
        self.recorder, self.faults = recorder, faults
        self.process = process or component
        self.phases: dict[str, PhaseStats] = {}  # method → its phase's counters, made once

    def __call__(self, method: str, *args):
        stats = self.phases.get(method) or self.phase_of(method)
        outer = self.recorder.enter(stats)
        try:
            if self.faults.armed and self.faults.fires(method):
                return self.faults.strike(self.worker, stats.name, method, *args)
            return getattr(self.worker, method)(*args)
        except (WorkerError, KeyboardInterrupt):
            raise
        except Exception as error:
            phase = stats.name
            raise WorkerError(
                self.process,
                self.rank,
                phase,
                type(error).__name__,
                str(error),
                traceback.format_exc(),
                time.time(),
                (self.recorder.identity["component"], self.recorder.identity["rank"]),
            ) from None
        finally:
            self.recorder.exit_phase(outer)

    def phase_of(self, method: str) -> PhaseStats:
        stats = self.phases[method] = self.recorder.stats(f"{self.component}.{method}")
        return stats
