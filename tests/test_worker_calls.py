"""Typed worker calls: a group is called with its worker class's own methods, checked at the call
site before anything runs; the name that travels to the worker is derived from the method."""

from __future__ import annotations

import threading

import pytest

from fleetrl.cluster.groups import InlineGroup, NotAWorkerMethod, RayGroup
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
    group = RayGroup([], [], RolloutWorker, threading.Event())
    with pytest.raises(NotAWorkerMethod, match="EnvWorker.step is not a method of RolloutWorker"):
        group.call(0, EnvWorker.step)
    assert group.wire_name(RolloutWorker.act) == "act"
    env = group.view("env", EnvWorker)
    assert env.wire_name(EnvWorker.step) == "env.step"
    assert env.interrupt is group.interrupt
