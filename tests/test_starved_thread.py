"""A thread starved of CPU by the host's load is busy, not blocked: a real process whose main
thread computes while pinned to one CPU at the lowest priority (`SCHED_IDLE`), beside busy loops
at the normal one, publishes through its real heartbeat a run delay (probe/thread_activity.py)
that grows by most of the wall time — the evidence the watchdog judges it busy (starved) on
(watch/judgement.py), where its few % of CPU alone would read as blocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fleetrl.watch.judgement import BLOCKED, BUSY, STARVED_SHARE, Judgement, Seen
from tests.support import subprocess_env

# The starved process: its heartbeat thread (normal priority, any CPU) publishes every 0.25 s;
# its main thread, in a phase, pins itself to the hogs' CPU, drops to SCHED_IDLE and computes
# for 4 s of wall time — hashing, which releases the GIL as a torch kernel does, so the beats
# are not held up behind it; the records are printed as one JSON list.
STARVED = """
import hashlib, json, os, sys, time
from fleetrl.probe.flight_recorder import Recorder

cpu = int(sys.argv[1])
records = []
recorder = Recorder("env", 0, 0)
recorder.start_publishing(records.append, 0.25)
recorder.enter_phase("env.step")
os.sched_setaffinity(0, {cpu})  # this thread only, as the scheduling policy below
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
end = time.monotonic() + 4.0
data = bytes(1 << 20)
while time.monotonic() < end: hashlib.sha256(data).digest()
recorder.stop()
print(json.dumps([json.loads(record) for record in records]))
"""
HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE policy")
def test_a_thread_starved_of_cpu_publishes_its_run_delay_and_is_judged_busy():
    cpu = min(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(cpu)]) for _ in range(2)]
    try:
        starved = subprocess.run(
            [sys.executable, "-c", STARVED, str(cpu)],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=30)
    assert starved.returncode == 0, starved.stderr
    records = [r for r in json.loads(starved.stdout) if r["phase"] == "env.step"]
    assert len(records) >= 3, records
    first, last = records[0], records[-1]
    delay, wall = last["thread_run_delay_s"] - first["thread_run_delay_s"], last["time"] - first["time"]
    assert delay >= STARVED_SHARE * wall, (delay, wall)

    judgement = judged(records)
    assert (judgement.state, judgement.starved) == (BUSY, delay / wall), judgement.text()
    assert judgement.text().startswith("busy (starved): its thread waited for a CPU"), judgement.text()
    # Without the evidence (a worker older than the field), its share of a core at SCHED_IDLE
    # beside two busy loops (~0.2 % by the scheduler's weights) at one line reads as blocked
    older = judged([{key: value for key, value in r.items() if key != "thread_run_delay_s"} for r in records])
    assert older.state == BLOCKED, older.text()


def judged(records: list[dict]) -> Judgement:
    seen = Seen()
    for record in records:
        seen.update(record, now=record["time"])
    return seen.judge(now=records[-1]["time"], window_s=60.0)
