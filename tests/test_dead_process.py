"""A worker killed on this machine is dead to the watchdog from the moment it exits, reaped by its
parent or not (watch/judging/verdict.py `has_ended`). A Ray worker's parent is the raylet, which on a
loaded host reaps it late, while its peers' connections to it are reset at once: the survivor's
"Connection reset by peer" must not be named the culprit while the dead rank is a zombie. The
watcher's own child is the exception: its exit is read by the watcher's wait, with its status (the
supervisor's controller, between a normal exit and its reaping, is not a death). Real processes:
one killed and left unreaped by another parent, one killed and left unreaped by this one, one
alive, one stopped."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import psutil

from fleetrl.config.schema import WatchdogConfig
from fleetrl.watch.judging.verdict import Checks, has_ended

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
# A parent that kills its child and does not reap it: the child is a zombie of another process
ORPHANED_ZOMBIE = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
child.send_signal(signal.SIGKILL)
print(child.pid, flush=True)
time.sleep(120)
"""


def record(pid: int) -> dict:
    """A heartbeat record of a worker on this machine, as the watchdog annotates it."""
    return {"pid": pid, "host": socket.gethostname(), "node": 0, "phase": "actor.train", "phase_age_s": 0.5}


def wait_for_status(process: subprocess.Popen | psutil.Process, status: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while psutil.Process(process.pid).status() != status:
        assert time.monotonic() < deadline, f"pid {process.pid} never became {status}"
        time.sleep(0.02)


def test_a_killed_worker_not_yet_reaped_is_dead_and_named():
    parent = subprocess.Popen([sys.executable, "-c", ORPHANED_ZOMBIE], stdout=subprocess.PIPE)
    own, alive, stopped = (subprocess.Popen(SLEEPER) for _ in range(3))
    try:
        killed = psutil.Process(int(parent.stdout.readline()))
        wait_for_status(killed, psutil.STATUS_ZOMBIE)  # exited, its parent not waiting
        own.send_signal(signal.SIGKILL)
        wait_for_status(own, psutil.STATUS_ZOMBIE)  # exited, this test (its parent) not waiting yet
        stopped.send_signal(signal.SIGSTOP)
        wait_for_status(stopped, psutil.STATUS_STOPPED)
        assert has_ended(killed.pid)
        assert not has_ended(own.pid) and not has_ended(alive.pid) and not has_ended(stopped.pid)

        checks = Checks(WatchdogConfig(), [("actor", 0), ("actor", 1), ("env", 0), ("controller", 0)])
        records = {
            ("controller", 0): record(own.pid),
            ("actor", 0): record(alive.pid),
            ("env", 0): record(stopped.pid),
            ("actor", 1): record(killed.pid),
        }
        for beat in records.values():
            beat["heartbeat_age_s"] = 0.2
        incident = checks.check_alive(records, time.time())
        assert incident is not None and incident.cause == "worker_died", incident
        assert incident.culprit == ("actor", 1), incident.summary
        assert f"pid {killed.pid}" in incident.summary and "in actor.train" in incident.summary, incident.summary
        assert checks.process_state(records[("actor", 1)], stopped=False) == "the process is gone"
        del records[("actor", 1)]
        assert checks.check_alive(records, time.time()) is None  # its own child's exit is its wait's to read
    finally:
        for process in (parent, own, alive, stopped):
            process.kill()
            process.wait(timeout=30)
    assert has_ended(own.pid)  # reaped: no such process
