"""What the watchdog's blocked-vs-busy evidence costs each heartbeat, side by side in one process.

A worker's heartbeat thread builds its record and serialises it every `heartbeat_interval_s`
(0.5 s). Since issue 11 the record also carries the CPU seconds of the process and of the
phase's thread and a signature of that thread's stack (fleetrl/probe/flight_recorder.py). This
measures, interleaved over --rounds rounds, from a second thread (as the heartbeat thread does)
while another thread sits in a phase `--depth` frames deep: a whole beat's record + JSON, and each
new field's function alone; their share of the beat, and of one core at the default interval.
With `--children N` the process first starts N simulator-like subprocesses of `--threads` threads
each (asleep), and the beat also reads theirs: `subprocess_cpu`, whose share is then printed too
(probe/child_activity.py: three small reads per thread of theirs).

    .venv/bin/python benchmarks/costs/heartbeat_fields.py [--rounds 7] [--depth 30] [--children 8 --threads 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from fleetrl.probe.child_activity import subprocess_cpu
from fleetrl.probe.flight_recorder import Recorder, stack_signature, thread_cpu_s

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the kit
from kit import per_call_us  # noqa: E402

INTERVAL_S = 0.5  # watchdog.heartbeat_interval_s default
# A subprocess of `threads` threads, all asleep until its stdin closes: what a simulator's server
# looks like to the beat between its steps
SLEEPER = (
    "import sys, threading\n"
    "for _ in range(int(sys.argv[1]) - 1):\n"
    "    threading.Thread(target=sys.stdin.read, daemon=True).start()\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def park_in_phase(recorder: Recorder, depth: int, ready: threading.Event, done: threading.Event) -> None:
    """The 'main' thread of the measurement: `depth` frames deep inside a phase, waiting."""
    if depth:
        return park_in_phase(recorder, depth - 1, ready, done)
    with recorder.in_phase("env.step"):
        ready.set()
        done.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--depth", type=int, default=30, help="frames of the parked thread's stack")
    parser.add_argument("--children", type=int, default=0, help="subprocesses the beat also reads")
    parser.add_argument("--threads", type=int, default=8, help="threads of each subprocess")
    args = parser.parse_args()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", SLEEPER, str(args.threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for _ in range(args.children)
    ]
    try:
        for child in children:
            child.stdout.readline()  # its threads are up
        measure(args)
    finally:
        for child in children:
            child.stdin.close()
            child.wait(10)


def measure(args: argparse.Namespace) -> None:
    recorder, ready, done = Recorder("env", 0, 0), threading.Event(), threading.Event()
    parked = threading.Thread(target=park_in_phase, args=(recorder, args.depth, ready, done), daemon=True)
    parked.start()
    ready.wait()
    thread = recorder.phase_thread

    measured = {
        "record + JSON (a whole beat but the store write)": lambda: json.dumps(recorder.record()),
        "stack_signature alone": lambda: stack_signature(thread),
        "thread_cpu_s alone": lambda: thread_cpu_s(thread),
        "time.process_time alone": time.process_time,
    }
    if args.children:
        measured[f"subprocess_cpu alone ({args.children} subprocesses x {args.threads} threads)"] = subprocess_cpu
    rounds: dict[str, list[float]] = {name: [] for name in measured}
    for _ in range(args.rounds):  # interleaved: drifting load hits every variant alike
        for name, fn in measured.items():
            rounds[name].append(per_call_us(fn, 200 if name.startswith("subprocess_cpu") else 5000, time.perf_counter))
    done.set()
    median = {name: statistics.median(values) for name, values in rounds.items()}
    for name, us in median.items():
        print(f"| {name} | {us:.2f} µs |")
    fields = median["stack_signature alone"] + median["thread_cpu_s alone"] + median["time.process_time alone"]
    beat = median["record + JSON (a whole beat but the store write)"]
    print(
        f"the new fields are {fields / beat:.0%} of a beat's record + JSON (beat with/without: {beat / (beat - fields):.2f}x)"
    )
    print(
        f"new fields: {fields:.2f} µs per beat = {fields / (INTERVAL_S * 1e6):.1e} of a core at one beat per {INTERVAL_S} s"
    )

    for name, us in median.items():
        if name.startswith("subprocess_cpu"):
            print(
                f"{name}: {us / beat:.0%} of the beat; {us / (INTERVAL_S * 1e6):.1e} of a core at one beat per {INTERVAL_S} s"
            )


if __name__ == "__main__":
    main()
