"""Stacks asked of a worker through a real heartbeat store, answered by the worker's own heartbeat
thread in a real process; a worker that cannot answer is dumped from outside only where its pid
means something (this machine, this PID namespace), and a pid said to live elsewhere is never
signalled."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from fleetrl.probe.seal import run_secret
from fleetrl.probe.stack_requests import StackAsker, ask_stacks, request_key
from fleetrl.probe.stacks import capture_stacks
from fleetrl.probe.store import HeartbeatStore
from tests.support import REPO, subprocess_env

WORKER = """
import re, sys, time
from fleetrl.probe.recorded_calls import WatchSpec, start_watching
from fleetrl.probe.seal import run_secret
recorder = start_watching("env", 0, 0, WatchSpec("127.0.0.1", int(sys.argv[1]), 0.1, sys.argv[2], {}, run_secret()))

def park_here():
    while True:
        time.sleep(0.01)

def hold_gil():  # the regular expression engine never releases the GIL: a C loop holding it
    re.match(r"(a+)+$", "a" * 40 + "b")

with recorder.in_phase(sys.argv[3]):
    hold_gil() if sys.argv[3] == "hold_gil" else park_here()
"""


@pytest.fixture
def worker(tmp_path, request):
    """A watched worker process (`request.param`: park_here or hold_gil) beating into this test's
    store every 0.1 s; the store, the process, its record once it is parked (or its first, when
    it holds the GIL: it may never publish another) and its stack folder."""
    store = HeartbeatStore("127.0.0.1", run_secret())
    command = [sys.executable, "-c", WORKER, str(store.port), str(tmp_path / "stacks"), request.param]
    process = subprocess.Popen(command, cwd=REPO, env=subprocess_env())
    try:
        deadline = time.monotonic() + 120
        while not ready(record := store.read([("env", 0)]).get(("env", 0)), request.param):
            assert process.poll() is None, f"the worker exited with {process.returncode}"
            assert time.monotonic() < deadline, f"no heartbeat of a worker in {request.param}: {record}"
            time.sleep(0.1)
        yield store, process, record, tmp_path / "stacks"
    finally:
        process.kill()
        process.wait()


def ready(record: dict | None, mode: str) -> bool:
    return record is not None and (mode == "hold_gil" or record["phase"] == mode)


@pytest.mark.parametrize("worker", ["park_here"], indirect=True)
def test_a_worker_answers_with_every_threads_stack(worker):
    store, process, record, stack_dir = worker
    stacks = capture_stacks([record], stack_dir, StackAsker(store.sealed, 30))
    text = stacks[("env", 0)]
    assert "in park_here" in text and '"MainThread"' in text, text
    assert '"fleetrl-heartbeat" (taking these stacks)' in text, text
    asked_again = ask_stacks(store.sealed, [("env", 0)], timeout_s=30)  # a second request, a fresh answer
    assert "in park_here" in asked_again[("env", 0)]
    assert process.poll() is None


@pytest.mark.parametrize("worker", ["park_here"], indirect=True)
def test_a_stopped_worker_is_read_from_outside_and_a_pid_elsewhere_is_never_signalled(worker):
    store, process, record, stack_dir = worker
    bystander = subprocess.Popen(["sleep", "60"])  # SIGUSR1 would kill it: its default action
    try:
        process.send_signal(signal.SIGSTOP)
        elsewhere = {**record, "component": "actor", "pid": bystander.pid, "host": "node-7", "machine": "other/1"}
        stacks = capture_stacks([record, elsewhere], stack_dir, StackAsker(store.sealed, 1.0))
        stopped, _, read = stacks[("env", 0)].partition("read from outside by py-spy)")
        assert "process is stopped" in stopped and "park_here" in read, stacks
        assert "runs on node-7, not on this machine" in stacks[("actor", 0)], stacks
        assert bystander.poll() is None, "a pid said to live on another machine was signalled"
        process.send_signal(signal.SIGCONT)  # running again, it answers through the store
        assert "in park_here" in ask_stacks(store.sealed, [("env", 0)], timeout_s=30)[("env", 0)]
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("worker", ["hold_gil"], indirect=True)
def test_a_worker_holding_the_gil_is_dumped_from_outside_with_native_frames(worker):
    """Its heartbeat thread cannot run, so it cannot answer; faulthandler's handler needs no
    GIL, and py-spy reads the process from outside, down to the C function."""
    store, process, record, stack_dir = worker
    deadline = time.monotonic() + 60
    while (age := time.time() - store.read([("env", 0)])[("env", 0)]["time"]) < 1.5:  # until it stops beating
        assert time.monotonic() < deadline, "the worker kept beating: it never held the GIL"
        time.sleep(0.1)
    # its beats stopped for longer than an answer may take: it is not asked, nor waited for
    stacks = capture_stacks([{**record, "heartbeat_age_s": age}], stack_dir, StackAsker(store.sealed, 1.0))
    assert store.sealed.add(request_key("env", 0), 0) == 0, "a worker whose heartbeat thread cannot run was asked"
    text = stacks[("env", 0)]
    python, _, native = text.partition("--- py-spy (native) ---")
    assert "in hold_gil" in python, text
    assert "hold_gil" in native and "_sre" in native, text
    assert process.poll() is None
