"""What the machine does besides the benchmark: the CPU that *other* processes use while a job
runs (a 2-core shared host slows a 1-2-thread job several-fold), waiting for a quiet machine, and
the CPU time of one call (robust to that load where wall time is not)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, of which steal) CPU-seconds of the whole machine since boot (/proc/stat, all cores).
    Steal counts as busy: time the hypervisor gave another guest slows a job as much as a local
    process does."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, steal / tick


def own_cpu_seconds() -> tuple[float, float]:
    """(this process, its waited-for descendants) CPU-seconds."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


class ForeignLoad:
    """Over a `with` block: `cores`, the average number of cores busy with processes that are not
    this one or its waited-for children (steal included); `steal_cores`; `own_cores`;
    `children_cpu_s`; `wall_s`. (Ray daemons that outlive the waited-for child are counted as
    foreign: an overestimate.)"""

    def __enter__(self):
        self.t0, (self.busy0, self.steal0), (self.me0, self.kids0) = (
            time.monotonic(),
            machine_cpu_seconds(),
            own_cpu_seconds(),
        )
        return self

    def __exit__(self, *exc):
        self.wall_s = max(time.monotonic() - self.t0, 1e-9)
        (busy, steal), (me, kids) = machine_cpu_seconds(), own_cpu_seconds()
        self.children_cpu_s = kids - self.kids0
        own = me - self.me0 + self.children_cpu_s
        self.cores = max(0.0, (busy - self.busy0 - own) / self.wall_s)
        self.own_cores = own / self.wall_s
        self.steal_cores = (steal - self.steal0) / self.wall_s
        return False

    def record(self) -> dict:
        return {"foreign_cores": self.cores, "steal_cores": self.steal_cores, "wall_s": self.wall_s}


def wait_for_quiet(threshold: float, max_wait: float) -> dict:
    """Wait (at most `max_wait` s) until other processes use < `threshold` cores over two
    consecutive 0.5 s windows: the comparisons time 1-2-thread jobs that slow down several-fold
    under contention."""
    started, quiet, busiest = time.monotonic(), 0, 0.0
    while time.monotonic() - started < max_wait:
        with ForeignLoad() as load:
            time.sleep(0.5)
        busiest = max(busiest, load.cores)
        quiet = quiet + 1 if load.cores < threshold else 0
        if quiet >= 2:
            return {"waited_s": time.monotonic() - started, "quiet": True}
    return {"waited_s": time.monotonic() - started, "quiet": False, "busiest_cores": busiest}


def per_call_us(function, calls: int, clock=time.process_time) -> float:
    """Microseconds per call of `function` after one warm-up call, by `clock`: by default the CPU
    time of this process (all its threads), since on a loaded host wall time mostly measures the
    wait for a core; `time.perf_counter` where the wait is what is measured."""
    function()  # warm-up
    started = clock()
    for _ in range(calls):
        function()
    return (clock() - started) / calls * 1e6
