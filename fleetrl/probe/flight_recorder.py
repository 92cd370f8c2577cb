"""The worker-side flight recorder: what this process is doing, published as a heartbeat.

Every worker process has one `Recorder`. The worker host marks each method call as a phase
(`env.step`, `rollout.act`, `actor.train`, ...) and counts the collectives each call makes;
fleetrl's own collectives and DDP's gradient buckets are entered into its `CollectiveLog`
(per-group sequence number, op, shapes, dtypes, call site, entry and completion).
A daemon thread publishes the record to the controller's store every `interval_s`, independently
of the main loop: a main thread stuck in C code that releases the GIL (a collective, a simulator
waiting on its device) keeps beating with a growing phase age; one that holds the GIL, or a
stopped process, stops beating — which the watchdog reads as frozen.

A process that sends calls to workers in processes of their own (the controller, on Ray) also
publishes the calls it waits on (`waiting_on`: cluster/groups.py `RayGroup.get`): the watcher
tells what a dead worker was doing from it where the worker's own last beat predates the call
(watch/naming.py `doing`). A wait is published at once, from the waiting thread, when it begins:
the worker may die a moment later, before the next beat.

Each record also says whether the phase's thread is working, for the watchdog to tell a blocked
call from a busy one: the CPU seconds of that thread and of the process, and a signature of that
thread's stack (~10 us a beat, benchmarks/costs/heartbeat_fields.py). Ages are published as the
worker's own elapsed times (`phase_elapsed_s`) and a beat counter (`beat`), so that the watcher
never subtracts one machine's clock from another's.
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
from pathlib import Path

from fleetrl.probe.child_activity import subprocess_cpu
from fleetrl.probe.collectives import DEFAULT_GROUP, CollectiveLog
from fleetrl.probe.gpu import gpu_use
from fleetrl.probe.thread_activity import WaitSampler, native_id_of, thread_io_bytes, thread_run_delay_s

HEARTBEAT_PREFIX = "fleetrl/heartbeat/"
RAYLET_VARIABLE = "FLEETRL_RAYLET"  # host:port of the worker's node manager, set per worker by the Ray backend
# Before each beat of a call older than one interval, its thread is sampled this many times, this
# far apart: what it sits in, a wait or not (probe/thread_activity.py)
SAMPLES_PER_BEAT, SAMPLE_GAP_S = 5, 0.01


def heartbeat_key(component: str, rank: int) -> str:
    return f"{HEARTBEAT_PREFIX}{component}/{rank}"


_now, _thread_id = time.time, threading.get_ident  # bound once: the phase marks run per env step


class PhaseStats:
    """One phase's counters, updated in place by each call: calls entered, the longest finished
    call (seconds; None before one has finished) and the collectives the last finished call made."""

    __slots__ = ("name", "calls", "longest_s", "collectives")

    def __init__(self, name: str):
        self.name, self.calls = name, 0
        self.longest_s: float | None = None
        self.collectives: int | None = None


class Recorder:
    def __init__(self, component: str, rank: int, node: int):
        self.identity = {
            "component": component,
            "rank": rank,
            "node": node,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "machine": machine_identity(),
            "raylet": os.environ.get(RAYLET_VARIABLE),  # watch/judging/node_loss.py
            "stderr": stderr_file(),  # a dead worker's last words are read from it (watch/judging/last_words.py)
        }
        self.current: PhaseStats | None = None  # the phase running now
        self.phase_started: float | None = None
        self.phase_thread: int = threading.get_ident()  # the thread running the phase
        self.beats = 0
        self.phases: dict[str, PhaseStats] = {}
        self.collectives = CollectiveLog()
        self.call_base = 0  # collectives.count when the current phase call began
        self.publisher: threading.Thread | None = None
        self.stopped = threading.Event()
        self.wake = threading.Event()  # set: publish the next beat at once (`beat_soon`)
        self.waits = WaitSampler()
        # The calls this process waits on, ((component, phase, ranks, sent at), ...): `wait_on`
        self.waiting: tuple = ()
        self.publish: Callable[[str], None] | None = None  # set by `start_publishing`
        self.publishing = threading.Lock()  # one beat at a time: the heartbeat thread's, or a wait's

    def call(self) -> tuple:
        """(start, thread) of the phase call running now: one call, whatever its phase's name."""
        return (self.phase_started, self.phase_thread)

    def sample_waits(self, older_than_s: float) -> None:
        """Sample what the current call's thread sits in, if the call is older than `older_than_s`
        (short calls, the hot path, are never sampled)."""
        started = self.phase_started
        if started is not None and _now() - started >= older_than_s:
            self.waits.take(self.call(), SAMPLES_PER_BEAT, SAMPLE_GAP_S, self.call)

    @property
    def phase(self) -> str | None:
        current = self.current
        return None if current is None else current.name

    def stats(self, name: str) -> PhaseStats:
        """Phase `name`'s counters (made on first use); a caller that runs it often keeps them."""
        stats = self.phases.get(name)
        if stats is None:
            stats = self.phases.setdefault(name, PhaseStats(name))
        return stats

    def enter(self, stats: PhaseStats) -> tuple:
        """Start the phase of `stats`; returns what `exit_phase` needs to restore the enclosing
        one. This runs twice per env step: it updates fields in place, one clock read, one
        tuple (plain calls rather than a context manager)."""
        outer = (self.current, self.phase_started, self.phase_thread, self.call_base)
        stats.calls += 1
        self.current, self.phase_started = stats, _now()
        self.phase_thread, self.call_base = _thread_id(), self.collectives.count
        return outer

    def enter_phase(self, name: str) -> tuple:
        return self.enter(self.stats(name))

    def exit_phase(self, outer: tuple) -> None:
        stats, duration = self.current, _now() - self.phase_started
        longest = stats.longest_s
        if longest is None or duration > longest:
            stats.longest_s = duration
        stats.collectives = self.collectives.count - self.call_base
        self.current, self.phase_started, self.phase_thread, self.call_base = outer

    @contextlib.contextmanager
    def in_phase(self, name: str):
        outer = self.enter_phase(name)
        try:
            yield
        finally:
            self.exit_phase(outer)

    @contextlib.contextmanager
    def in_collective(self, op: str, tensors, group: str = DEFAULT_GROUP):
        """A synchronous collective: entered here, completed when the block ends."""
        entry = self.collectives.enter(op, tensors, group)
        try:
            yield
        finally:
            self.collectives.complete(entry)

    def record(self) -> dict:
        """The heartbeat: read here, in the publishing thread, from what the phases keep in place."""
        self.beats += 1
        now, current, phase_started, thread = time.time(), self.current, self.phase_started, self.phase_thread
        native = native_id_of(thread)
        phases = list(self.phases.values())  # one C-level copy: the main thread may add a phase meanwhile
        finished = [stats for stats in phases if stats.longest_s is not None]
        return {
            **self.identity,
            "time": now,
            "beat": self.beats,
            "phase": None if current is None else current.name,
            "phase_started": phase_started,
            "phase_elapsed_s": None if phase_started is None else now - phase_started,
            "cpu_s": time.process_time(),
            "thread_cpu_s": thread_cpu_s(thread),
            "stack_signature": stack_signature(thread),
            "thread_io_bytes": thread_io_bytes(native),
            "thread_run_delay_s": thread_run_delay_s(native),  # evidence of starvation (watch/judging/judgement.py)
            **self.waits.fields((phase_started, thread)),  # a spinning wait's evidence (watch/judging/judgement.py)
            **subprocess_cpu(),  # subprocesses it may wait on, computing (probe/child_activity.py)
            **gpu_use(),  # gpu_util_pct, gpu_memory_mib where this process computes on a GPU
            "phase_counts": {stats.name: stats.calls for stats in phases},
            "phase_max_s": {stats.name: stats.longest_s for stats in finished},
            "call_collectives": {stats.name: stats.collectives for stats in finished},
            "collectives_in_call": self.collectives.count - self.call_base if current else None,
            **self.collectives.record(),
            "waiting_on": [
                {"component": component, "phase": name, "ranks": list(ranks), "elapsed_s": now - sent}
                for component, name, ranks, sent in self.waiting
            ],
        }

    def publish_record(self) -> None:
        with self.publishing:
            self.publish(json.dumps(self.record()))

    def wait_on(self, waiting: tuple) -> None:
        """This process now waits on the calls `waiting` — ((component, phase, ranks, sent at:
        epoch seconds), ...), empty once the wait is over. A wait that begins is published now,
        from the caller's thread; its end at the next beat, woken now (the heartbeat thread's)."""
        if waiting == self.waiting:
            return
        self.waiting = waiting
        if not waiting or self.publish is None:
            self.beat_soon()
            return
        with contextlib.suppress(Exception):  # a lost beat is reported as staleness
            self.publish_record()

    def start_publishing(
        self, publish: Callable[[str], None], interval_s: float, after_beat: Callable[[], None] = lambda: None
    ) -> None:
        """Publish `record()` as JSON every `interval_s` from a daemon thread; then `after_beat()`
        (answering a stack request: probe/stack_requests.py)."""
        self.publish = publish

        def beat():
            while not self.stopped.is_set():
                self.wake.wait(interval_s)
                self.wake.clear()
                if self.stopped.is_set():
                    return
                with contextlib.suppress(Exception):  # a lost beat is reported as staleness
                    self.sample_waits(interval_s)
                    self.publish_record()
                    after_beat()

        self.publish_record()
        self.publisher = threading.Thread(target=beat, name="fleetrl-heartbeat", daemon=True)
        self.publisher.start()

    def beat_soon(self) -> None:
        """Publish a beat now rather than up to an interval later: a moment the watcher must not
        miss (the controller's training begins; its last beat would otherwise still say
        start-up to a watcher that finds it stopped or dead a moment later)."""
        self.wake.set()

    def stop(self) -> None:
        """Stop publishing and wait for the publishing thread: a daemon thread still inside a
        store call while the interpreter exits takes the process down with std::terminate."""
        self.stopped.set()
        self.wake.set()
        join_unless_current(self.publisher)


def machine_identity() -> str:
    """Which machine and PID namespace this process's pid means something in: the kernel's boot
    id and the PID namespace's inode. Two hosts (or two isolated simulated nodes) may share a
    hostname; a pid can be signalled only where this matches."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        return f"{boot_id}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # not Linux: the hostname is all there is
        return socket.gethostname()


def stderr_file() -> str | None:
    """The regular file this process's stderr writes to (a Ray worker's `worker-*.err`), else None."""
    try:
        path = os.readlink("/proc/self/fd/2")
    except OSError:
        return None
    return path if path.startswith("/") and Path(path).is_file() else None


def join_unless_current(thread: threading.Thread | None, timeout_s: float = 5.0) -> None:
    if thread is not None and thread is not threading.current_thread() and thread.is_alive():
        thread.join(timeout_s)


def thread_cpu_s(thread: int) -> float | None:
    """CPU seconds used by `thread` (a `threading.get_ident()`), None if it is gone."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread))
    except (OSError, OverflowError, AttributeError):  # AttributeError: no per-thread clocks (macOS)
        return None


def stack_signature(thread: int) -> int | None:
    """A hash of (file, line) along `thread`'s stack: equal on two beats when it has not moved.
    Reads no source, unlike `traceback`; None if the thread is gone."""
    frame = sys._current_frames().get(thread)
    if frame is None:
        return None
    where = []
    while frame is not None:
        where.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return hash(tuple(where)) & 0xFFFFFFFF


_recorder: Recorder | None = None


def install(recorder: Recorder) -> None:
    global _recorder
    _recorder = recorder


def current() -> Recorder | None:
    """This process's recorder (None in a process fleetrl does not manage, e.g. a test)."""
    return _recorder


def collective(op: str, *tensors, group: str = DEFAULT_GROUP):
    """Mark a collective for the flight recorder; a no-op context where none is installed."""
    return _recorder.in_collective(op, tensors, group) if _recorder else contextlib.nullcontext()


def beat_soon() -> None:
    """`Recorder.beat_soon` of this process's recorder, where one is installed."""
    if _recorder:
        _recorder.beat_soon()


def waiting_on(waiting: tuple) -> None:
    """`Recorder.wait_on` of this process's recorder, where one is installed."""
    if _recorder:
        _recorder.wait_on(waiting)


def phase(name: str):
    """Mark a phase of this process's own work (the controller's checkpoint save, say) for the
    flight recorder; a no-op context where none is installed."""
    return _recorder.in_phase(name) if _recorder else contextlib.nullcontext()
