"""The worker-side flight recorder: what this process is doing, published as a heartbeat.

Every worker process has one `Recorder`. The worker host marks each method call as a phase
(`env.step`, `rollout.act`, `actor.train`, ...); fleetrl's own collectives and DDP's gradient
buckets mark the collective they are in (sequence number, op, shapes, dtypes, call site, start).
A daemon thread publishes the record to the controller's store every `interval_s`, independently
of the main loop: a main thread stuck in C code that releases the GIL (a collective, a simulator
waiting on its device) keeps beating with a growing phase age; one that holds the GIL, or a
stopped process, stops beating — which the watchdog reads as frozen.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

from fleetrl.watch.node_loss import RAYLET_VARIABLE

HEARTBEAT_PREFIX = "fleetrl/heartbeat/"


def heartbeat_key(component: str, rank: int) -> str:
    return f"{HEARTBEAT_PREFIX}{component}/{rank}"


class Recorder:
    def __init__(self, component: str, rank: int, node: int):
        self.identity = {
            "component": component,
            "rank": rank,
            "node": node,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "raylet": os.environ.get(RAYLET_VARIABLE),  # watch/node_loss.py
        }
        self.phase: str | None = None
        self.phase_started: float | None = None
        self.phase_counts: dict[str, int] = {}
        self.phase_max_s: dict[str, float] = {}  # longest finished duration of each phase
        self.collective_seq = 0
        self.collective: dict | None = None  # the one in progress
        self.last_collective: dict | None = None
        self.publisher: threading.Thread | None = None
        self.stopped = threading.Event()

    def enter_phase(self, name: str) -> tuple:
        """Start phase `name`; returns what `exit_phase` needs to restore the enclosing one.
        (Plain calls rather than a context manager: this runs twice per env step.)"""
        outer = (self.phase, self.phase_started)
        self.phase, self.phase_started = name, time.time()
        self.phase_counts[name] = self.phase_counts.get(name, 0) + 1
        return outer

    def exit_phase(self, outer: tuple) -> None:
        name, duration = self.phase, time.time() - self.phase_started
        if duration > self.phase_max_s.get(name, 0.0):
            self.phase_max_s[name] = duration
        self.phase, self.phase_started = outer

    @contextlib.contextmanager
    def in_phase(self, name: str):
        outer = self.enter_phase(name)
        try:
            yield
        finally:
            self.exit_phase(outer)

    @contextlib.contextmanager
    def in_collective(self, op: str, tensors, group: str = "actor"):
        self.collective_seq += 1
        self.collective = {
            "seq": self.collective_seq,
            "op": op,
            "group": group,
            "shapes": [list(t.shape) for t in tensors],
            "dtypes": [str(t.dtype) for t in tensors],
            "call_site": call_site(),
            "started": time.time(),
        }
        try:
            yield
        finally:
            self.last_collective, self.collective = {**self.collective, "finished": time.time()}, None

    def record(self) -> dict:
        return {
            **self.identity,
            "time": time.time(),
            "phase": self.phase,
            "phase_started": self.phase_started,
            "phase_counts": dict(self.phase_counts),
            "phase_max_s": dict(self.phase_max_s),
            "collective": self.collective,
            "last_collective": self.last_collective,
        }

    def start_publishing(self, publish: Callable[[str], None], interval_s: float) -> None:
        """Publish `record()` as JSON every `interval_s` from a daemon thread."""

        def beat():
            while not self.stopped.wait(interval_s):
                with contextlib.suppress(Exception):  # a lost beat is reported as staleness
                    publish(json.dumps(self.record()))

        publish(json.dumps(self.record()))
        self.publisher = threading.Thread(target=beat, name="fleetrl-heartbeat", daemon=True)
        self.publisher.start()

    def stop(self) -> None:
        """Stop publishing and wait for the publishing thread: a daemon thread still inside a
        store call while the interpreter exits takes the process down with std::terminate."""
        self.stopped.set()
        join_unless_current(self.publisher)


def join_unless_current(thread: threading.Thread | None, timeout_s: float = 5.0) -> None:
    if thread is not None and thread is not threading.current_thread() and thread.is_alive():
        thread.join(timeout_s)


PLUMBING = ("/fleetrl/watch/", "/fleetrl/parallel/", "/torch/", contextlib.__file__)


def call_site() -> str:
    """The innermost frame outside fleetrl's parallel/watch plumbing, torch and contextlib, as
    file:line (func). Walks the frames themselves: `traceback.extract_stack` reads source lines
    and cost ~19 us here, on the path of every DDP gradient bucket."""
    frame = sys._getframe(1)
    for _ in range(20):
        if frame is None:
            break
        path = frame.f_code.co_filename
        if not any(part in path for part in PLUMBING):
            return f"{os.path.basename(path)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


_recorder: Recorder | None = None


def install(recorder: Recorder) -> None:
    global _recorder
    _recorder = recorder


def current() -> Recorder | None:
    """This process's recorder (None in a process fleetrl does not manage, e.g. a test)."""
    return _recorder


def collective(op: str, *tensors, group: str = "actor"):
    """Mark a collective for the flight recorder; a no-op context where none is installed."""
    return _recorder.in_collective(op, tensors, group) if _recorder else contextlib.nullcontext()
