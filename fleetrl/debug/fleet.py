"""Simulated workers for diagnosis at cluster scale: real flight recorders without the work.

A `SimulatedWorker` is a real `Recorder` (probe/flight_recorder.py) driven by a loop instead of a
training step: an actor rank enters `actor.train` and an `all_reduce` of the actor group per
step, an env worker `env.step`. Its records are the ones a real worker publishes (phases,
collectives with sequence numbers, call sites, CPU and stack fields), so the watchdog, the
alignment and the report read them as they read a real fleet's — at 1,024 workers on one machine
(benchmarks/diagnosis/scale_harness.py, tests/test_scale_diagnosis.py). Faults are what a user's bug does
to a rank: `skip` finishes a call without its collective, `hold` stays in a collective a peer
never enters; a frozen worker or a lost node is one that stops publishing.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetrl.probe.flight_recorder import Recorder

TRAIN_PHASE, ENV_PHASE = "actor.train", "env.step"
GROUP_SIZE = 256  # the actor group's ranks, at most; the other workers are env workers


@dataclass(frozen=True)
class Shaped:
    """What a collective entry reads of a tensor: its shape and dtype."""

    shape: tuple
    dtype: str = "torch.float32"


GRADIENT = (Shaped((1024,)),)


def fleet_layout(workers: int, per_node: int = 64) -> list[tuple[str, int, int]]:
    """(component, rank, node) of `workers` simulated workers: up to `GROUP_SIZE` actor ranks,
    the rest env workers, `per_node` to a node."""
    actors = min(workers, GROUP_SIZE)
    keys = [("actor", rank) for rank in range(actors)] + [("env", rank) for rank in range(workers - actors)]
    return [(component, rank, index // per_node) for index, (component, rank) in enumerate(keys)]


class SimulatedWorker:
    def __init__(self, component: str, rank: int, node: int, host: str):
        self.recorder = Recorder(component, rank, node)
        self.recorder.identity["host"] = host  # a simulated node: no local pid checks against it
        self.key = (component, rank)
        self.held = False  # inside a collective that will never complete

    def step(self) -> None:
        """One finished call: an actor rank's training step with one all_reduce, an env step."""
        if self.held:
            return
        if self.key[0] == "actor":
            with self.recorder.in_phase(TRAIN_PHASE), self.recorder.in_collective("all_reduce", GRADIENT):
                pass
        else:
            with self.recorder.in_phase(ENV_PHASE):
                pass

    def hold(self, since_s: float = 0.0) -> None:
        """Enter a training step and its all_reduce, and stay in it (a peer never enters it);
        entered `since_s` seconds ago (a test judges the wait without sleeping through it)."""
        self.recorder.enter_phase(TRAIN_PHASE)
        self.recorder.phase_started -= since_s
        self.recorder.collectives.enter("all_reduce", GRADIENT)["started"] -= since_s
        self.held = True

    def skip(self) -> None:
        """Finish a training step without its all_reduce: an early return on local data."""
        with self.recorder.in_phase(TRAIN_PHASE):
            pass
        self.held = True  # then idle: the waiting ranks never let the next step begin

    def record(self) -> dict:
        return self.recorder.record()
