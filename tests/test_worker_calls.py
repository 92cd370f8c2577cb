"""Typed worker calls: a group is called with its worker class's own methods, checked at the call
site before anything runs; the name that travels to the worker is derived from the method."""

from __future__ import annotations

import threading

import pytest

from fleetrl.cluster.groups import KEPT_PER_WORKER, InlineGroup, NotAWorkerMethod, RayGroup, SentCalls
from fleetrl.workers.env_worker import EnvWorker
from fleetrl.workers.rollout_worker import RolloutWorker


class Base:
    def step(self) -> str:
        return "base"

    def report(self) -> str:
        return "report"


class Worker(Base):
    def __init__(self):
        self.calls: list[str] = []

    def step(self) -> str:
        self.calls.append("step")
        return "override"


class Stranger:
    def step(self) -> str:
        return "stranger"


def test_a_base_class_method_runs_the_worker_s_override():
    group = InlineGroup([], [Worker()])
    assert group.call(0, Base.step) == "override"
    assert group.call_all(Base.report) == ["report"]


@pytest.mark.parametrize("method", [Stranger.step, "step", len, EnvWorker.step])
def test_a_method_the_worker_class_lacks_fails_at_the_call_site(method):
    worker = Worker()
    group = InlineGroup([], [worker])
    with pytest.raises(NotAWorkerMethod, match="is not a method of Worker or its bases"):
        group.call(0, method)
    assert worker.calls == []  # nothing ran


def test_ray_groups_check_before_sending_and_route_fused_components():
    """No Ray needed: the check and the wire name come before any handle is touched."""
    group = RayGroup([], [], RolloutWorker, threading.Event(), SentCalls())
    with pytest.raises(NotAWorkerMethod, match="EnvWorker.step is not a method of RolloutWorker"):
        group.call(0, EnvWorker.step)
    assert group.wire_name(RolloutWorker.act) == "act"
    env = group.view("env", EnvWorker)
    assert env.wire_name(EnvWorker.step) == "env.step"
    assert env.interrupt is group.interrupt and env.sent is group.sent


def test_a_wait_names_the_calls_it_waits_on_by_component_and_phase_sent_when_the_first_was():
    """What `RayGroup.get` publishes as the controller's wait (probe/flight_recorder.py `waiting_on`):
    the calls among the futures it waits on that were sent from here — the last KEPT_PER_WORKER of each
    worker are known, an older one or a worker's start (not sent through a group) are not."""
    from ray import ObjectRef

    sent = SentCalls()
    train = [ObjectRef.from_random() for _ in range(2)]
    sent.add(train[1], "actor", 1, "actor.train")
    sent.add(train[0], "actor", 0, "actor.train")
    report = ObjectRef.from_random()
    sent.add(report, "env", 0, "env.report")
    first = sent.sent[train[1].binary()][3]
    assert sent.waiting([*train, report, ObjectRef.from_random()]) == (
        ("actor", "actor.train", (0, 1), first),
        ("env", "env.report", (0,), sent.sent[report.binary()][3]),
    )
    steps = [ObjectRef.from_random() for _ in range(KEPT_PER_WORKER)]
    for step in steps:
        sent.add(step, "env", 0, "env.step")
    assert [call[:3] for call in sent.waiting([report, *steps])] == [("env", "env.step", (0,) * KEPT_PER_WORKER)]
    assert len(sent.sent) == 2 + KEPT_PER_WORKER  # the oldest of env rank 0's forgotten: at most 16 a worker
