"""A silent worker whose threads wait for a CPU is starved, not frozen.

A worker that stops publishing heartbeats is judged frozen (watch/judging/verdict.py): stopped (SIGSTOP),
gone, or — alive and not stopped — its Python threads not running, which the watchdog reads as the
GIL held by a C call. One more reason looks the same from the heartbeats: the process's threads
are ready to run but get no CPU — the host's other work at a higher priority (a job at nice 19,
SCHED_IDLE, a cgroup whose CPU quota is spent). Its heartbeat thread waits for a CPU, or for the GIL
of a thread that waits for one. Seen on this project's 2-core host: a `fleetrl sft` at nice 19
beside a fault-matrix run, reported "the GIL is held by a C call" and stopped (2026-11-28).

The evidence is each thread's scheduling state and CPU time (`/proc/<pid>/task/<tid>/stat`: state
`R`, ready or running, and utime + stime), sampled by the watcher at every poll once a worker on its
machine has been silent for two heartbeat intervals. The share of the samples that found a thread
ready, less the share of a core it used, is the share of the time it waited for a CPU. (The kernel's run delay in
`/proc/<pid>/task/<tid>/schedstat`, which the heartbeat itself carries, is only brought up to date
when the thread next runs: read from outside, a thread starved since its last turn shows none.) In
a real GIL hang the thread that holds the GIL runs and the others sleep on its lock: no thread
waits but what the host's load makes the holder wait. The share is high (4/5, where the judgement
of a stalled call uses 1/2: watch/judging/judgement.py) so that a GIL hang on a host loaded with work of
equal priority — its holder running half the time — is still named at the heartbeat timeout; a
false kill is avoided where a thread got at most a fifth of a CPU.

A starved worker is not judged frozen until it has been silent for `busy_allowance_s`, the bound a
computing call gets; one warning says so. Workers on other machines: no /proc to read, judged as
before. A worker beating again is forgotten, and sampled afresh if it goes silent again.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

from fleetrl.probe.child_activity import cpu_s, stat_fields

STARVED_SHARE = 0.8
MIN_SPAN_S = 1.0  # shorter spans are too few scheduler ticks to judge


def thread_states(pid: int) -> dict[int, tuple[bool, float]]:
    """Each thread of `pid`: (ready or running, CPU seconds used); {} if /proc cannot be read."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    states = {}
    for task in tasks:
        fields = stat_fields(f"/proc/{pid}/task/{task}/stat")
        if fields is not None:  # else the thread ended meanwhile
            states[int(task)] = (fields[0] == "R", cpu_s(fields))
    return states


class Silence:
    """One silent process's samples, kept as counts per thread: how many samples found it, how
    many found it ready, and its CPU seconds at the first and the latest."""

    def __init__(self, at: float, states: dict[int, tuple[bool, float]]) -> None:
        self.since = self.at = at
        self.first_cpu_s = {tid: cpu for tid, (_, cpu) in states.items()}
        self.cpu_s: dict[int, float] = {}
        self.current: set[int] = set()  # the threads of the latest sample
        self.seen: dict[int, int] = defaultdict(int)
        self.ready: dict[int, int] = defaultdict(int)

    def add(self, at: float, states: dict[int, tuple[bool, float]]) -> None:
        self.at, self.current = at, set(states)
        for tid, (ready, cpu) in states.items():
            self.seen[tid] += 1
            self.ready[tid] += ready
            self.cpu_s[tid] = cpu


class SilentWorkers:
    """The threads of this machine's silent workers, sampled at every poll since they fell silent
    (see the module docstring)."""

    def __init__(self) -> None:
        self.silences: dict[int, Silence] = {}

    def observe(self, pids_silent: set[int]) -> None:
        """Sample the local worker processes silent now; forget those beating again."""
        for pid in set(self.silences) - pids_silent:
            del self.silences[pid]
        for pid in pids_silent:
            at, states = time.monotonic(), thread_states(pid)
            self.silences.setdefault(pid, Silence(at, states)).add(at, states)

    def starved_share(self, pid: int) -> tuple[float, float] | None:
        """(the largest share of the sampled time that one of `pid`'s threads waited for a CPU —
        the share of the samples that found it ready, less the share of a core it used — and that
        time in seconds), or None with samples spanning less than `MIN_SPAN_S`."""
        silence = self.silences.get(pid)
        if silence is None or silence.at - silence.since < MIN_SPAN_S:
            return None
        span = silence.at - silence.since
        waits = [
            silence.ready[tid] / silence.seen[tid] - (silence.cpu_s[tid] - silence.first_cpu_s[tid]) / span
            for tid in silence.first_cpu_s.keys() & silence.current
        ]
        return max(waits, default=0.0), span
