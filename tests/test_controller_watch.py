"""The supervisor's order of incidents (watch/supervision.py `ControllerWatch.next_incident`): the
controller's own end comes before what the watchdog saw. On Ray a SIGKILLed controller's actors end
with it, and the watchdog may see them gone before the supervisor's loop polls the controller
again: the report must still name the controller (one CI run named actor rank 0)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetrl.plan.load import load_config
from fleetrl.probe.seal import run_secret
from fleetrl.watch.incident import Incident
from fleetrl.watch.supervision import ControllerWatch

CONFIG = "configs/ppo_cartpole.yaml"
ACTOR = ("actor", 0)


@pytest.fixture
def watched(tmp_path: Path):
    """A `ControllerWatch` over a real child process standing in for the controller (it never
    beats: inside the watchdog's start-up allowance nothing is judged of it)."""
    config = load_config(CONFIG, [f"runner.run_dir={tmp_path}"])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    watch = ControllerWatch(config, tmp_path, child, "controller", "127.0.0.1", run_secret(), end_processes=child.kill)
    yield watch, child
    watch.stop()
    child.kill()
    child.wait(timeout=30)


def actor_died() -> Incident:
    return Incident("worker_died", "actor rank 0 (pid 1) died: ended without a signal", 0.0, ACTOR)


def test_what_the_watchdog_saw_is_the_incident_while_the_controller_lives(watched):
    watch, child = watched
    watch.incidents.put(actor_died())
    assert child.poll() is None
    incident = watch.next_incident(None)
    assert (incident.cause, incident.culprit) == ("worker_died", ACTOR)


def test_a_controller_that_ended_after_the_poll_comes_before_what_the_watchdog_saw_since(watched):
    """The loop polled (None), then the controller was killed and the watchdog saw its actor end:
    that incident is set aside; the next poll's exit status makes the controller the culprit."""
    watch, child = watched
    code = child.poll()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    watch.incidents.put(actor_died())
    assert watch.next_incident(code) is None
    incident = watch.next_incident(child.poll())
    assert (incident.cause, incident.culprit) == ("worker_died", ("controller", 0))
    assert f"(the controller, pid {child.pid}) died: killed by SIGKILL" in incident.summary
