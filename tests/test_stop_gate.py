"""A stop signal that arrives once an iteration has trained waits for its metrics to be logged
(fleetrl/signals.py `stop_gate`): a real SIGINT to a real process, before and after
`hold_stops()`, and a second signal still stopping at once."""

from __future__ import annotations

import subprocess
import sys

from tests.support import subprocess_env

GATED = """
import os, signal, sys
from fleetrl.signals import Stop, hold_stops, install_stop_handlers, stop_gate

install_stop_handlers()
steps = []
try:
    with stop_gate():
        steps.append("trained")
        hold_stops()
        os.kill(os.getpid(), signal.SIGINT)
        steps.append("logged")  # reached: the stop waits for the gate's end
        if sys.argv[1] == "twice":
            os.kill(os.getpid(), signal.SIGINT)
            steps.append("never")
    steps.append("after the gate")
except Stop as stop:
    print(" ".join(steps), "| stopped by", stop, flush=True)
"""


def run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", GATED, mode], env=subprocess_env(), capture_output=True, text=True, timeout=60
    )


def test_a_stop_after_training_is_raised_once_the_record_is_logged():
    done = run("once")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "trained logged | stopped by SIGINT"


def test_a_second_stop_inside_the_gate_stops_at_once():
    done = run("twice")
    assert done.returncode == 128 + 2, (done.returncode, done.stdout, done.stderr)
    assert "second SIGINT: stopping now" in done.stderr and done.stdout == ""
