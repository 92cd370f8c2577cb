"""How a worker runs the controller's calls: each one a recorded phase, with faults injected
where `debug.fault` says. Used by the Ray worker host and by the inline groups alike."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fleetrl.watch import recorder as flight_recorder
from fleetrl.watch.faults import FaultPlan, inject_before
from fleetrl.watch.recorder import Recorder
from fleetrl.watch.stacks import register_stack_dump, stack_file
from fleetrl.watch.store import connect_publisher


@dataclass(frozen=True)
class WatchSpec:
    """What a worker process needs to be watched: where to beat, how often, where stacks go."""

    store_host: str
    store_port: int
    interval_s: float
    stack_dir: str
    fault: dict


def start_watching(component: str, rank: int, node: int, spec: WatchSpec) -> Recorder:
    """In a worker process: install its recorder, publish heartbeats, answer SIGUSR1 with stacks."""
    recorder = Recorder(component, rank, node)
    flight_recorder.install(recorder)
    register_stack_dump(stack_file(Path(spec.stack_dir), component, rank))
    recorder.start_publishing(connect_publisher(spec.store_host, spec.store_port, component, rank),
                              spec.interval_s)
    return recorder


class CallRunner:
    def __init__(self, worker, component: str, recorder: Recorder, faults: FaultPlan):
        self.worker, self.component, self.recorder, self.faults = worker, component, recorder, faults

    def __call__(self, method: str, *args):
        phase = f"{self.component}.{method}"
        with self.recorder.in_phase(phase):
            if self.faults.fires(method):
                inject_before(self.faults.kind, phase)
                if self.faults.kind == "extra_step":
                    getattr(self.worker, method)(*args)
            return getattr(self.worker, method)(*args)
