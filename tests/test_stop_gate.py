"""A stop signal that arrives once an iteration has trained waits for its metrics to be logged
(fleetrl/signals.py `stop_gate`): a real SIGINT to a real process, before and after
`hold_stops()`, and a second signal still stopping at once. One that arrives while an update is
sent to the ranks waits until every rank has it (`stops_wait`), and is raised once; another
thread's such block neither delays it nor takes it."""

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


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *args], env=subprocess_env(), capture_output=True, text=True, timeout=60
    )


def test_a_stop_after_training_is_raised_once_the_record_is_logged():
    done = run(GATED, "once")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "trained logged | stopped by SIGINT"


def test_a_second_stop_inside_the_gate_stops_at_once():
    done = run(GATED, "twice")
    assert done.returncode == 128 + 2, (done.returncode, done.stdout, done.stderr)
    assert "second SIGINT: stopping now" in done.stderr and done.stdout == ""


WHOLE = """
import os, signal, sys
from fleetrl.signals import Stop, hold_stops, install_stop_handlers, stop_gate, stops_wait

install_stop_handlers()
steps = []
try:
    with stop_gate():
        if sys.argv[1] == "held":
            hold_stops()
        with stops_wait():
            steps.append("rank 0")
            os.kill(os.getpid(), signal.SIGTERM)
            steps.append("rank 1")  # reached: the stop waits for the block's end
        steps.append("after the block")
    steps.append("after the gate")
except Stop as stop:
    steps.append(f"| stopped by {stop} |")
    with stop_gate():  # the stop's own work (settle, record, checkpoint) meets it no more
        hold_stops()
        with stops_wait():
            steps.append("settled")
    steps.append("checkpointed")
print(" ".join(steps), flush=True)
"""


def test_a_stop_while_an_update_is_sent_waits_until_every_rank_has_it_and_is_raised_once():
    done = run(WHOLE, "free")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rank 0 rank 1 | stopped by SIGTERM | settled checkpointed"


def test_inside_a_gate_that_holds_stops_it_waits_for_the_gate_s_end():
    done = run(WHOLE, "held")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "rank 0 rank 1 after the block | stopped by SIGTERM | settled checkpointed"


IN_ANOTHER_THREAD = """
import os, signal, threading
from fleetrl.signals import Stop, install_stop_handlers, stops_wait

install_stop_handlers()
inside, release, steps = threading.Event(), threading.Event(), []

def sends():
    with stops_wait():
        inside.set()
        release.wait(30)
    steps.append("the thread's block ended")

thread = threading.Thread(target=sends)
thread.start()
inside.wait(30)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    steps.append("never")
except Stop as stop:
    steps.append(f"main stopped by {stop}")
release.set()
thread.join(30)
print(" | ".join(steps), flush=True)
"""


def test_another_thread_s_block_neither_delays_the_main_thread_s_stop_nor_takes_it():
    done = run(IN_ANOTHER_THREAD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "main stopped by SIGTERM | the thread's block ended"
